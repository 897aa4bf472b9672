// The official OpenAI SDK (npm `openai`) against kvroute: plain and streamed chat with
// usage, a stream that did not ask for usage, and typed 401, 429 and 400 errors. Prints
// one JSON object for e2e/sdk_test.go to check.
import OpenAI from 'openai';
import { env, expectError } from './common.mjs';

const base = env('KVROUTE_URL') + '/v1';
const model = env('MODEL');
const client = new OpenAI({ baseURL: base, apiKey: env('GOOD_KEY'), maxRetries: 0 });
const messages = [{ role: 'user', content: 'hello there' }];
const out = {};

const r = await client.chat.completions.create({ model, messages, max_tokens: 4 });
out.plain = { object: r.object, content: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };

const collect = async (stream) => {
  const got = { text: '', chunks: 0, usage: null, usageChunks: 0, finish: null };
  for await (const c of stream) {
    got.chunks++;
    if (c.usage) got.usage = c.usage;
    if (c.choices.length === 0) got.usageChunks++;
    for (const ch of c.choices) {
      got.text += ch.delta?.content ?? '';
      if (ch.finish_reason) got.finish = ch.finish_reason;
    }
  }
  return got;
};
out.stream = await collect(await client.chat.completions.create({ model, messages, max_tokens: 4, stream: true, stream_options: { include_usage: true } }));
out.streamNoUsage = await collect(await client.chat.completions.create({ model, messages, max_tokens: 4, stream: true }));

const bad = new OpenAI({ baseURL: base, apiKey: env('BAD_KEY'), maxRetries: 0 });
out.unauthorized = await expectError(() => bad.chat.completions.create({ model, messages, max_tokens: 4 }), OpenAI.AuthenticationError);
const small = new OpenAI({ baseURL: base, apiKey: env('SMALL_KEY'), maxRetries: 0 });
out.rateLimited = await expectError(() => small.chat.completions.create({ model, messages, max_tokens: 5000 }), OpenAI.RateLimitError);
out.badRequest = await expectError(() => client.chat.completions.create({ model, messages: [], max_tokens: 4 }), OpenAI.BadRequestError);

console.log(JSON.stringify(out));
