/* admin-client.ts: a typed client of authsvc's admin API for a platform's web tier, one method per
 * operation (docs/admin-api.md, "The OpenAPI document"). Its types are generated from the document
 * the admin service serves, so a call the document does not allow does not compile:
 *
 *     npx openapi-typescript http://127.0.0.1:8081/openapi.json -o admin-api.d.ts
 *
 * No package at run time: the global fetch and crypto of Node 20 or a browser-like runtime (the web
 * tier's server, never a player's browser: the API token must not reach one). tests/integration/test_openapi_clients.py
 * type-checks it (tsc --strict --noEmit) against the repository's document, and runs each method against
 * the admin API under gunicorn.
 *
 * Ids are numbers: user and game ids above 2^53 do not fit one (keep them under it). The audit
 * cursor is a string for that reason (AuditCursor).
 */
import type { components, operations } from "./admin-api";

type Schemas = components["schemas"];
export type Player = Schemas["Player"];
export type PlayerPut = Schemas["PlayerPut"];
export type BatchPlayer = Schemas["BatchPlayer"];
export type BatchResult = Schemas["BatchResult"];
export type Revoked = Schemas["Revoked"];
export type Deleted = Schemas["Deleted"];
export type Minted = Schemas["Minted"];
export type Game = Schemas["Game"];
export type NewGame = Schemas["NewGame"];
export type RotatedKey = Schemas["RotatedKey"];
export type AuditPage = Schemas["AuditPage"];
export type AuditRecord = Schemas["AuditRecord"];
export type AuditCursor = Schemas["AuditCursor"];
export type Problem = Schemas["Problem"];
export type Webhook = Schemas["Webhook"];
export type NewWebhook = Schemas["NewWebhook"];
export type WebhookAdd = Schemas["WebhookAdd"];
export type Delivery = Schemas["Delivery"];
export type DeliveryPage = Schemas["DeliveryPage"];
export type DeliveryQuery = NonNullable<operations["listDeliveries"]["parameters"]["query"]>;
/** Which deliveries POST /v1/webhooks/{webhook_id}/deliveries/retry makes due (state: pending, failed or both). */
export type RetryQuery = NonNullable<operations["retryDeliveries"]["parameters"]["query"]>;
/** What it answers: how many were made due now. */
export type Retried = operations["retryDeliveries"]["responses"][200]["content"]["application/json"];
/** The filters of GET /v1/audit, as the document lists them (after, limit, player, game, action, actor). */
export type AuditQuery = NonNullable<operations["listAudit"]["parameters"]["query"]>;
/** What GET /openapi.json answers. */
export type Document = operations["getOpenAPI"]["responses"][200]["content"]["application/json"];

/** An error answer; .problem is its problem+json body (type, title, status, detail, errors). */
export class AdminError extends Error {
  constructor(readonly status: number, readonly problem: Problem) {
    super(`admin API ${status} ${problem.type}: ${problem.detail}`);
  }
}

type Query = Record<string, string | number | undefined>;

export class AdminClient {
  constructor(private readonly baseUrl: string, private readonly token: string) {}

  /* -- players ------------------------------------------------------------------------------- */

  /** The player and its ETag (GET /v1/players/{user_id}). */
  async getPlayer(userId: number): Promise<Player & { etag: string }> {
    const response = await this.send("GET", `/v1/players/${userId}`);
    return { ...((await response.json()) as Player), etag: response.headers.get("ETag") ?? "" };
  }

  /** The player's ETag alone (HEAD /v1/players/{user_id}). */
  async playerEtag(userId: number): Promise<string> {
    return (await this.send("HEAD", `/v1/players/${userId}`)).headers.get("ETag") ?? "";
  }

  /** Signup, rename, ban or unban (PUT /v1/players/{user_id}); with ifMatch, only if nobody changed it
   * since (412 otherwise). created: the call made the player (201). */
  async putPlayer(userId: number, player: PlayerPut, ifMatch?: string): Promise<Player & { etag: string; created: boolean }> {
    const headers: Record<string, string> = ifMatch === undefined ? {} : { "If-Match": ifMatch };
    const response = await this.send("PUT", `/v1/players/${userId}`, { body: player, headers });
    const answer = (await response.json()) as Player;
    return { ...answer, etag: response.headers.get("ETag") ?? "", created: response.status === 201 };
  }

  /** Every token of the player stops working (POST /v1/players/{user_id}/revoke). */
  async revokePlayer(userId: number): Promise<Revoked> {
    return this.json<Revoked>("POST", `/v1/players/${userId}/revoke`);
  }

  /** The player goes, its names erased (DELETE /v1/players/{user_id}); with ifMatch, only if nobody
   * changed it since (412 otherwise). Its tokens are refused from effective_by on. */
  async deletePlayer(userId: number, ifMatch?: string): Promise<Deleted> {
    const headers: Record<string, string> = ifMatch === undefined ? {} : { "If-Match": ifMatch };
    return (await (await this.send("DELETE", `/v1/players/${userId}`, { headers })).json()) as Deleted;
  }

  /** Up to 1,000 players at once (POST /v1/players/batch): a result per item. */
  async batchPlayers(players: BatchPlayer[], dryRun = false): Promise<BatchResult> {
    const body: Schemas["Batch"] = { players, dry_run: dryRun };
    return this.json<BatchResult>("POST", "/v1/players/batch", { body });
  }

  /* -- tokens -------------------------------------------------------------------------------- */

  /** The player's current game_auth_token for a game (POST /v1/tokens). */
  async mintToken(gameId: number, userId: number): Promise<Minted> {
    const body: Schemas["MintRequest"] = { game_id: gameId, user_id: userId };
    return this.json<Minted>("POST", "/v1/tokens", { body });
  }

  /* -- games --------------------------------------------------------------------------------- */

  /** A new game and its api key, shown in this answer only (POST /v1/games). */
  async addGame(name: string): Promise<NewGame> {
    const body: Schemas["GameAdd"] = { name };
    return this.json<NewGame>("POST", "/v1/games", { body });
  }

  /** The game: its keys' times, never a key (GET /v1/games/{game_id}). */
  async getGame(gameId: number): Promise<Game> {
    return this.json<Game>("GET", `/v1/games/${gameId}`);
  }

  /** Whether the game exists (HEAD /v1/games/{game_id}). */
  async gameExists(gameId: number): Promise<boolean> {
    try {
      await this.send("HEAD", `/v1/games/${gameId}`);
      return true;
    } catch (error) {
      if (error instanceof AdminError && error.status === 404) return false;
      throw error;
    }
  }

  /** Enable or disable the game (PATCH /v1/games/{game_id}). */
  async setGameEnabled(gameId: number, enabled: boolean): Promise<Game> {
    const body: Schemas["GamePatch"] = { enabled };
    return this.json<Game>("PATCH", `/v1/games/${gameId}`, { body });
  }

  /** A new api key; the older ones stop working oldKeyTtl seconds from now, one day if left out
   * (POST /v1/games/{game_id}/keys). */
  async rotateGameKey(gameId: number, oldKeyTtl?: number): Promise<RotatedKey> {
    const body: Schemas["KeyRotation"] = oldKeyTtl === undefined ? {} : { old_key_ttl: oldKeyTtl };
    return this.json<RotatedKey>("POST", `/v1/games/${gameId}/keys`, { body });
  }

  /* -- the audit trail ----------------------------------------------------------------------- */

  /** One page of the audit trail, newest first (GET /v1/audit). */
  async audit(query: AuditQuery = {}): Promise<AuditPage> {
    return this.json<AuditPage>("GET", "/v1/audit", { query });
  }

  /** Every record the filters select, page by page: each page's next is the following page's after. */
  async *auditRecords(query: AuditQuery = {}): AsyncGenerator<AuditRecord> {
    for (let after: AuditCursor | undefined = query.after; ; ) {
      const page = await this.audit({ ...query, after });
      yield* page.records;
      if (page.next === null) return;
      after = page.next;
    }
  }

  /** Whether this client's token may read the audit trail (HEAD /v1/audit: 403 without audit:read). */
  async canReadAudit(): Promise<boolean> {
    try {
      await this.send("HEAD", "/v1/audit", { query: { limit: 1 } });
      return true;
    } catch (error) {
      if (error instanceof AdminError && error.status === 403) return false;
      throw error;
    }
  }

  /* -- webhooks ------------------------------------------------------------------------------ */

  /** Subscribe a URL to events; its signing secret is in this answer only (POST /v1/webhooks). */
  async addWebhook(webhook: WebhookAdd): Promise<NewWebhook> {
    return this.json<NewWebhook>("POST", "/v1/webhooks", { body: webhook });
  }

  /** Every webhook, never a secret (GET /v1/webhooks). */
  async listWebhooks(): Promise<Webhook[]> {
    return (await this.json<{ webhooks: Webhook[] }>("GET", "/v1/webhooks")).webhooks;
  }

  /** One webhook (GET /v1/webhooks/{webhook_id}). */
  async getWebhook(webhookId: number): Promise<Webhook> {
    return this.json<Webhook>("GET", `/v1/webhooks/${webhookId}`);
  }

  /** End a webhook: its pending deliveries fail (DELETE /v1/webhooks/{webhook_id}). */
  async removeWebhook(webhookId: number): Promise<{ id: number; deleted: true }> {
    return this.json<{ id: number; deleted: true }>("DELETE", `/v1/webhooks/${webhookId}`);
  }

  /** A page of a webhook's deliveries, oldest first (GET /v1/webhooks/{webhook_id}/deliveries). */
  async deliveries(webhookId: number, query: DeliveryQuery = {}): Promise<DeliveryPage> {
    return this.json<DeliveryPage>("GET", `/v1/webhooks/${webhookId}/deliveries`, { query });
  }

  /** After a receiver's outage: send its pending and failed deliveries now (POST /v1/webhooks/{webhook_id}/deliveries/retry). */
  async retryDeliveries(webhookId: number, query: RetryQuery = {}): Promise<Retried> {
    return this.json<Retried>("POST", `/v1/webhooks/${webhookId}/deliveries/retry`, { query });
  }

  /** Send a failed delivery again (POST /v1/webhooks/{webhook_id}/deliveries/{delivery_id}/retry). */
  async retryDelivery(webhookId: number, deliveryId: number): Promise<Delivery> {
    return this.json<Delivery>("POST", `/v1/webhooks/${webhookId}/deliveries/${deliveryId}/retry`);
  }

  /* -- this document ------------------------------------------------------------------------- */

  /** The OpenAPI document the service serves (GET /openapi.json; no token needed). */
  async document(): Promise<Document> {
    return this.json<Document>("GET", "/openapi.json");
  }

  /** Its length in bytes (HEAD /openapi.json). */
  async documentLength(): Promise<number> {
    return Number((await this.send("HEAD", "/openapi.json")).headers.get("Content-Length"));
  }

  /* -- one request --------------------------------------------------------------------------- */

  private async json<T>(method: string, path: string, options: { body?: unknown; query?: Query } = {}): Promise<T> {
    return (await (await this.send(method, path, options)).json()) as T;
  }

  /** The answer of a success; an AdminError otherwise. A POST or DELETE carries an Idempotency-Key, the same on
   * each try; a 429 or 503 is tried again after its Retry-After, twice at most. */
  private async send(
    method: string, path: string, options: { body?: unknown; query?: Query; headers?: Record<string, string> } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = { Authorization: `Bearer ${this.token}`, ...options.headers };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    if (method === "POST" || method === "DELETE") headers["Idempotency-Key"] = crypto.randomUUID();
    const url = new URL(path, this.baseUrl);
    for (const [name, value] of Object.entries(options.query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    for (let attempt = 1; ; attempt++) {
      const response = await fetch(url, {
        method, headers, body: options.body === undefined ? undefined : JSON.stringify(options.body),
        signal: AbortSignal.timeout(5000),
      });
      if (response.ok) return response;
      const wait = response.headers.get("Retry-After") ?? "";
      if ((response.status === 429 || response.status === 503) && attempt < 3 && /^\d+$/.test(wait) && Number(wait) <= 30) {
        await new Promise((resolve) => setTimeout(resolve, Number(wait) * 1000));
        continue;
      }
      // A HEAD answer has no body: its problem is only the status.
      const fallback: Problem = { type: "", title: response.statusText, status: response.status, detail: "" };
      const problem = method === "HEAD" ? fallback : ((await response.json().catch(() => fallback)) as Problem);
      throw new AdminError(response.status, problem);
    }
  }
}
