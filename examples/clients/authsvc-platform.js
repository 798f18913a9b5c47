/* authsvc-platform.js: the platform's client-side interface (docs/integrating.md).
 *
 * One file, two halves, no dependencies:
 *   - the platform page calls AuthsvcPlatform.host(iframe, {gameOrigin, player, refresh}) to answer its
 *     game's iframe; player is {user_id, username, game_auth_token} for THIS game, or null (a guest);
 *     refresh is a function returning a Promise of a freshly minted player (the platform's server mints it);
 *   - the game's page (inside the iframe) calls AuthsvcPlatform.connect({platformOrigin}), a Promise
 *     of that player (or null), and may listen for "authsvc:player" events on window;
 *   - when authsvc refuses the token (a 403: the password changed), the game's page calls
 *     AuthsvcPlatform.refresh({platformOrigin}), a Promise of the new player (or null) the platform pushes.
 * Messages go by postMessage with an exact target origin, and each side drops a message whose
 * origin or source window is not the one it expects. The page never holds the api key.
 */
(function (global) {
  "use strict";
  var HELLO = "authsvc:hello", PLAYER = "authsvc:player", REFRESH = "authsvc:refresh";
  var REFRESH_INTERVAL_MS = 2000;  // a game asking again within this gets the token just minted

  function copyPlayer(p) {
    if (!p) return null;
    return {user_id: p.user_id, username: p.username, game_auth_token: p.game_auth_token};
  }

  /* Platform side: answer the game's hello with the player; answer its refresh with a player freshly
   * minted by options.refresh() (one at a time; a refresh within REFRESH_INTERVAL_MS of the last one gets
   * that one's player); push a new player with .update(player). Without options.refresh, a refresh
   * reloads the platform page, which mints a new token as it loads. */
  function host(iframe, options) {
    var gameOrigin = options.gameOrigin, player = copyPlayer(options.player), refreshing = false, refreshedAt = -Infinity;
    function send() {
      if (iframe.contentWindow) iframe.contentWindow.postMessage({type: PLAYER, player: player}, gameOrigin);
    }
    function refresh() {
      if (refreshing) return;  // the answer to the one running goes to the game
      if (!options.refresh) { global.location.reload(); return; }
      if (Date.now() - refreshedAt < REFRESH_INTERVAL_MS) { send(); return; }
      refreshing = true;
      Promise.resolve().then(options.refresh).then(function (p) { player = copyPlayer(p); }, function () {
        /* no new token (the platform's server did not answer): the game hears the player it had */
      }).then(function () { refreshing = false; refreshedAt = Date.now(); send(); });
    }
    global.addEventListener("message", function (event) {
      if (event.origin !== gameOrigin || event.source !== iframe.contentWindow) return;
      if (event.data && event.data.type === HELLO) send();
      else if (event.data && event.data.type === REFRESH) refresh();
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

  /* Game side: ask the platform for a fresh token (after authsvc refused the one the page holds); a
   * Promise of the player the platform answers with (or null: nobody is signed in there any more). */
  function refresh(options) {
    var platformOrigin = options.platformOrigin, timeoutMs = options.timeoutMs || 10000;
    return new Promise(function (resolve, reject) {
      var timer = null;
      if (global.parent === global) { resolve(null); return; }  // not embedded: a guest
      function answer(event) {
        if (event.origin !== platformOrigin || event.source !== global.parent) return;
        if (!event.data || event.data.type !== PLAYER) return;
        global.removeEventListener("message", answer);
        clearTimeout(timer);
        resolve(copyPlayer(event.data.player));
      }
      global.addEventListener("message", answer);
      timer = setTimeout(function () {
        global.removeEventListener("message", answer);
        reject(new Error("the platform did not answer"));
      }, timeoutMs);
      global.parent.postMessage({type: REFRESH}, platformOrigin);
    });
  }

  global.AuthsvcPlatform = {host: host, connect: connect, refresh: refresh};
})(window);
