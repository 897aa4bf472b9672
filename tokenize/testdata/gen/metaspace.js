#!/usr/bin/env node
// Golden ids for the Metaspace pre-tokenizer (tokenize/testdata/golden/llama2_metaspace.json).
// No shipped file of the fetched families uses Metaspace (Llama 2's tokenizer.json is the
// legacy Prepend+Replace normalizer form), so each variant is Llama 2's tokenizer.json
// with normalizer null and pre_tokenizer Metaspace(prepend_scheme, split), the form
// tokenizers' converters write for non-legacy Llama/Mistral files. The Go test
// (TestMetaspaceExact) builds the same variants. Ids from Hugging Face's tokenizers core.
// Usage: node metaspace.js <tokenizers dir> <testdata dir>
const fs = require('fs');
const os = require('os');
const path = require('path');
const { Tokenizer } = require('tokenizers');

const [root, testdata] = process.argv.slice(2);
const corpus = JSON.parse(fs.readFileSync(path.join(testdata, 'corpus.json'), 'utf8'));
const variants = { first: ['first', true], always: ['always', true], never_nosplit: ['never', false] };
(async () => {
  const base = JSON.parse(fs.readFileSync(path.join(root, 'llama2', 'tokenizer.json'), 'utf8'));
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'metaspace-'));
  const out = { texts: corpus.texts.concat(corpus.more_texts).map((t) => t.name), variants: {} };
  for (const [name, [scheme, split]] of Object.entries(variants)) {
    base.normalizer = null;
    base.pre_tokenizer = { type: 'Metaspace', replacement: '\u2581', prepend_scheme: scheme, split };
    const file = path.join(tmp, name + '.json');
    fs.writeFileSync(file, JSON.stringify(base));
    const tok = Tokenizer.fromFile(file);
    const ids = [];
    for (const t of corpus.texts.concat(corpus.more_texts)) {
      ids.push(Array.from((await tok.encode(t.text, null, { addSpecialTokens: false })).getIds()));
    }
    out.variants[name] = ids;
  }
  fs.rmSync(tmp, { recursive: true });
  fs.writeFileSync(path.join(testdata, 'golden', 'llama2_metaspace.json'), JSON.stringify(out) + '\n');
})().catch((e) => { console.error(e); process.exit(1); });
