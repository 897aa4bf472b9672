// Package admission is kvroute's admission stage, the same for `serve` (ext_proc) and
// `proxy`: identity → budget reservation → (router.Pick books) → settlement.
//
// A front calls, per request:
//
//  1. Identify, before the pick: the tenant from the configured sources
//     (admission.identity, in order, first that yields wins): a verified JWT claim in
//     ext_proc metadata_context (Envoy jwt_authn payload_in_metadata), a tenant header
//     only when it cannot come from the client (ext_proc behind an Envoy that removes
//     the client's copy; proxy from admission.trusted_peers only — from anyone else it
//     is ignored and counted), an API key looked up by SHA-256 in admission.api_keys_file;
//     otherwise Unattributed, or 401 with admission.require_tenant.
//  2. Reserve, right after router.Pick: the cost w_uncached·uncached prompt +
//     w_cached·cached prompt + w_output·(min(max_tokens, max_output_reservation), else the estimate), from the
//     router's own counts (Ticket.PromptTokens, Ticket.CachedTokens), checked and charged
//     in one step against the tenant's tokens per minute, requests per minute and
//     concurrency. A refusal is a 429 *router.Error with Retry-After,
//     x-kvroute-rejected-reason (token_budget, request_budget, concurrency_limit) and
//     OpenAI's x-ratelimit-* headers (the front aborts the ticket and answers through
//     front.ErrorReply).
//  3. Grant.Settle, once, when the ticket ends (completed or aborted): the actual cost
//     replaces the reservation — from usage when the engine reported it, else from the
//     generated tokens counted in the stream (tenants with a token budget,
//     Grant.CountsTokens), else the estimate stands
//     (kvroute_admission_settlements_total{usage_source}).
//
// Budgets use fixed windows aligned to the Unix epoch: the minute of
// tokens_per_minute and requests_per_minute, any token_windows (a 24h one is a UTC
// day), per tenant and per tenant × model. A request with max_tokens reserves
// min(max_tokens, max_output_reservation) output tokens, what it may generate (so a
// burst cannot overrun a window by more than one request's overrun past the cap);
// one without reserves the learned p90 output of the tenant × model,
// default_output_tokens before history (outputHistory: bounded rings, bounded keys).
//
// Backends: local keeps budgets in memory under one mutex; redis (redis.go) keeps them
// in Redis for several replicas, reserve and settle each one Lua script (atomic on the
// server), settle exactly once per ticket key. Either way reserve is check-and-charge
// in one step, so concurrent requests against a budget of exactly K tokens admit
// exactly what fits. While Redis is unreachable each tenant's redis_down mode applies
// (local 1/N fallback, fail_open, fail_closed; Admitter.reserve).
//
// QoS (qos.go, fairqueue.go): Classify puts a request in a class of admission.classes
// (first match over tenant, API, model, headers, JWT claims, prompt tokens); Pick picks
// through the router with the class objective and, for a class with a queue, waits in
// Queue while the router answers router.ErrWait, woken by router.OnCapacity; the order
// is FairQueue's (priority, then the Virtual Token Counter of Sheng et al., OSDI '24,
// then FCFS), a pure core kvbench also runs in virtual time.
//
// Both fronts ask streamed requests that name no stream_options for usage
// (proxy.inject_include_usage, extproc.inject_include_usage where the Envoy body modes
// let it replace the bodies; request.WithIncludeUsage) so that they settle on it; other
// streams without usage settle on counted content.
package admission
