// The official Anthropic SDK (npm `@anthropic-ai/sdk`) against kvroute: plain and
// streamed messages with usage, and typed 401, 429 and 400 errors. Prints one JSON
// object for e2e/sdk_test.go to check.
import Anthropic from '@anthropic-ai/sdk';
import { env, expectError } from './common.mjs';

const base = env('KVROUTE_URL');
const model = env('MODEL');
const client = new Anthropic({ baseURL: base, apiKey: env('GOOD_KEY'), maxRetries: 0 });
const req = { model, max_tokens: 4, system: 'be brief', messages: [{ role: 'user', content: 'hello there' }] };
const out = {};

const m = await client.messages.create(req);
out.plain = { type: m.type, role: m.role, text: m.content[0]?.text, stop: m.stop_reason, usage: m.usage };

// the SDK's stream helper: every event as it arrives, and the message it accumulates
const s = client.messages.stream(req);
const events = [];
s.on('streamEvent', (ev) => events.push(ev.type));
const fin = await s.finalMessage();
out.stream = { events, text: fin.content[0]?.text, stop: fin.stop_reason, usage: fin.usage };

const bad = new Anthropic({ baseURL: base, apiKey: env('BAD_KEY'), maxRetries: 0 });
out.unauthorized = await expectError(() => bad.messages.create(req), Anthropic.AuthenticationError);
const small = new Anthropic({ baseURL: base, apiKey: env('SMALL_KEY'), maxRetries: 0 });
out.rateLimited = await expectError(() => small.messages.create({ ...req, max_tokens: 5000 }), Anthropic.RateLimitError);
const { max_tokens, ...noMax } = req;
out.badRequest = await expectError(() => client.messages.create(noMax), Anthropic.BadRequestError);

console.log(JSON.stringify(out));
