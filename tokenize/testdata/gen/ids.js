#!/usr/bin/env node
// Golden token ids for tokenize/testdata/golden/<family>.json, from Hugging Face's
// own tokenizers core (npm `tokenizers`, the Node binding of the Rust crate vLLM uses
// through transformers). Usage: node ids.js <tokenizers dir> <testdata dir> <rendered.json> family...
//
// transformers' LlamaTokenizerFast/GemmaTokenizerFast rebuild the post-processor from
// tokenizer_config.json's add_bos_token/add_eos_token (DeepSeek V3 gets its BOS that way);
// the Rust core reads tokenizer.json only, so that rule is applied here explicitly.
const fs = require('fs');
const path = require('path');
const crypto = require('crypto');
const { Tokenizer } = require('tokenizers');

const [root, testdata, renderedPath, ...families] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(path.join(testdata, 'corpus.json'), 'utf8'));
const rendered = JSON.parse(fs.readFileSync(renderedPath, 'utf8'));

function digest(ids) {
  return crypto.createHash('sha256').update(ids.join(',')).digest('hex');
}

(async () => {
  for (const fam of families) {
    const tok = Tokenizer.fromFile(path.join(root, fam, 'tokenizer.json'));
    const cfg = JSON.parse(fs.readFileSync(path.join(root, fam, 'tokenizer_config.json'), 'utf8'));
    const cls = (cfg.tokenizer_class || '').replace(/Fast$/, '');
    const rebuild = ['LlamaTokenizer', 'GemmaTokenizer', 'CodeLlamaTokenizer'].includes(cls);
    const tokStr = (v) => (v && typeof v === 'object' ? v.content : v);
    const encode = async (text, special) => {
      if (special && rebuild) {
        const ids = Array.from((await tok.encode(text, null, { addSpecialTokens: false })).getIds());
        const bos = cfg.add_bos_token === undefined ? true : cfg.add_bos_token;
        const eos = cfg.add_eos_token === true;
        const pre = bos ? [tok.tokenToId(tokStr(cfg.bos_token))] : [];
        const post = eos ? [tok.tokenToId(tokStr(cfg.eos_token))] : [];
        return pre.concat(ids, post);
      }
      return Array.from((await tok.encode(text, null, { addSpecialTokens: special })).getIds());
    };
    const out = { family: fam, texts: [], more_texts: [], long: [], chats: [] };
    for (const t of corpus.texts) {
      out.texts.push({ name: t.name, special: await encode(t.text, true), plain: await encode(t.text, false) });
    }
    for (const t of corpus.more_texts || []) {
      out.more_texts.push({ name: t.name, special: await encode(t.text, true), plain: await encode(t.text, false) });
    }
    for (const name of corpus.long) {
      const text = fs.readFileSync(path.join(testdata, name), 'utf8');
      const ids = await encode(text, false);
      out.long.push({ name, count: ids.length, sha256: digest(ids), head: ids.slice(0, 64) });
    }
    for (const c of corpus.chats) {
      const r = rendered[fam] && rendered[fam][c.name];
      if (r === null || r === undefined) continue;
      if (typeof r === 'object') {
        out.chats.push({ name: c.name, error: r.error });
        continue;
      }
      out.chats.push({ name: c.name, text: r, ids: await encode(r, false) });
    }
    fs.mkdirSync(path.join(testdata, 'golden'), { recursive: true });
    fs.writeFileSync(path.join(testdata, 'golden', fam + '.json'), JSON.stringify(out) + '\n');
  }
})().catch((e) => { console.error(e); process.exit(1); });
