/* authsvc-platform.js: the platform's client-side interface (docs/integrating.md).
 *
 * One file, two halves, no dependencies:
 *   - the platform page calls AuthsvcPlatform.host(iframe, {gameOrigin, player}) to answer its
 *     game's iframe; player is {user_id, username, game_auth_token} for THIS game, or null (a guest);
 *   - the game's page (inside the iframe) calls AuthsvcPlatform.connect({platformOrigin}), a Promise
 *     of that player (or null), and may listen for "authsvc:player" events on window.
 * Messages go by postMessage with an exact target origin, and each side drops a message whose
 * origin or source window is not the one it expects. The page never holds the api key.
 */
(function (global) {
  "use strict";
  var HELLO = "authsvc:hello", PLAYER = "authsvc:player";

  function copyPlayer(p) {
    if (!p) return null;
    return {user_id: p.user_id, username: p.username, game_auth_token: p.game_auth_token};
  }

  /* Platform side: answer the game's hello (and push a new player with .update(player)). */
  function host(iframe, options) {
    var gameOrigin = options.gameOrigin, player = copyPlayer(options.player);
    function send() {
      if (iframe.contentWindow) iframe.contentWindow.postMessage({type: PLAYER, player: player}, gameOrigin);
    }
    global.addEventListener("message", function (event) {
      if (event.origin !== gameOrigin || event.source !== iframe.contentWindow) return;
      if (event.data && event.data.type === HELLO) send();
    });
    return {update: function (p) { player = copyPlayer(p); send(); }};
  }

  /* Game side: a Promise of the player (or null for a guest); later pushes arrive as
   * window events "authsvc:player" with event.detail = the player or null. */
  function connect(options) {
    var platformOrigin = options.platformOrigin, timeoutMs = options.timeoutMs || 10000;
    return new Promise(function (resolve, reject) {
      var settled = false, tries = 0, timer = null;
      if (global.parent === global) { resolve(null); return; }  // not embedded: a guest
      global.addEventListener("message", function (event) {
        if (event.origin !== platformOrigin || event.source !== global.parent) return;
        if (!event.data || event.data.type !== PLAYER) return;
        var player = copyPlayer(event.data.player);
        if (!settled) { settled = true; clearInterval(timer); resolve(player); }
        global.dispatchEvent(new CustomEvent(PLAYER, {detail: player}));
      });
      function hello() {
        if (settled) return;
        if (tries++ * 200 >= timeoutMs) { clearInterval(timer); reject(new Error("the platform did not answer")); return; }
        global.parent.postMessage({type: HELLO}, platformOrigin);
      }
      timer = setInterval(hello, 200);
      hello();
    });
  }

  global.AuthsvcPlatform = {host: host, connect: connect};
})(window);
