// What the SDK e2e test (e2e/sdk_test.go) reads of an SDK error: its class, HTTP status,
// the typed fields each SDK parses from the body, and the rate-limit headers.
export function errInfo(e) {
  const h = e.headers;
  const get = (k) => (h && typeof h.get === 'function' ? h.get(k) : undefined) ?? null;
  return {
    class: e.constructor.name,
    status: e.status ?? null,
    type: e.type ?? e.error?.error?.type ?? null, // OpenAI: e.type; Anthropic: the body's error.type
    param: e.param ?? null,
    message: e.message,
    retryAfter: get('retry-after'),
    remainingTokens: get('x-ratelimit-remaining-tokens'),
  };
}

// expectError runs f, which must throw an SDK APIError of class cls; returns errInfo.
export async function expectError(f, cls) {
  try {
    await f();
  } catch (e) {
    if (!(e instanceof cls)) throw new Error(`want ${cls.name}, got ${e.constructor.name}: ${e.message}`);
    return errInfo(e);
  }
  throw new Error(`want ${cls.name}, the call succeeded`);
}

export const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
