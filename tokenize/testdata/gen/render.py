#!/usr/bin/env python3
"""Renders the corpus chats with each family's chat template the way vLLM does
(vllm/entrypoints/chat_utils.py + transformers' apply_chat_template environment), using
jinja2 -- the engine transformers uses. Writes JSON {family: {chat name: text | null}}
to stdout. Usage: render.py <tokenizers dir> <corpus.json> family...

Independent of kvroute's Go code: it is the reference the Go renderer is compared with.
"""
import json, sys, os, re
from datetime import datetime
import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols


def env():
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)
    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    def strftime_now(fmt):
        return datetime.now().strftime(fmt)
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = strftime_now
    return e


def content_format(src):
    # vLLM detects "openai" when the template loops over message content.
    return "openai" if re.search(r"for\s+\w+\s+in\s+\w+(\[\s*['\"]content['\"]\s*\]|\.content)", src) else "string"


def norm_content(c, fmt):
    if c is None:
        parts = []
    elif isinstance(c, str):
        if fmt == "string":
            return c
        parts = [c]
    else:
        parts = [p["text"] for p in c]
    if fmt == "openai":
        return [{"type": "text", "text": p} for p in parts]
    return "\n".join(p for p in parts if p)


def norm_messages(msgs, fmt):
    # vllm/entrypoints/chat_utils.py _parse_chat_message_content + _postprocess_messages
    out = []
    for m in msgs:
        r = {"role": m["role"], "content": norm_content(m.get("content"), fmt)}
        if m["role"] == "assistant":
            if m.get("tool_calls"):
                calls = []
                for tc in m["tool_calls"]:
                    tc = dict(tc)
                    fn = dict(tc["function"])
                    a = fn.get("arguments")
                    if isinstance(a, str):
                        try:
                            fn["arguments"] = json.loads(a)
                        except ValueError:
                            fn["arguments"] = {}
                    elif not isinstance(a, (dict, list)):
                        fn["arguments"] = {}
                    tc["function"] = fn
                    calls.append(tc)
                r["tool_calls"] = calls
            reasoning = m.get("reasoning", m.get("reasoning_content"))
            if reasoning is not None:
                r["reasoning"] = reasoning
                r["reasoning_content"] = reasoning
        if m["role"] == "tool":
            if "tool_call_id" in m:
                r["tool_call_id"] = m["tool_call_id"]
            if isinstance(r["content"], list):
                r["content"] = "\n".join(p["text"] for p in r["content"])
        for k in ("name", "task"):
            if isinstance(m.get(k), str):
                r[k] = m[k]
        out.append(r)
    return out


def norm_tools(tools):
    if not tools:
        return None
    out = []
    for t in tools:
        f = t["function"]
        fn = {"name": f["name"], "description": f.get("description"), "parameters": f.get("parameters")}
        if "strict" in f and f["strict"] is not None:
            fn["strict"] = f["strict"]
        out.append({"type": "function", "function": fn})
    return out


def token_str(v):
    if isinstance(v, dict):
        return v.get("content")
    return v


def render(cfg, src, req):
    fmt = content_format(src)
    msgs = norm_messages(req["messages"], fmt)
    kw = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        s = token_str(cfg.get(k))
        if s:
            kw[k] = s
    add = [token_str(a) for a in cfg.get("additional_special_tokens") or [] if token_str(a)]
    if add:
        kw["additional_special_tokens"] = add
    agp = req.get("add_generation_prompt", True)
    cfm = req.get("continue_final_message", False)
    kw.update(dict(messages=msgs, tools=norm_tools(req.get("tools")), documents=None,
                   add_generation_prompt=agp, continue_final_message=cfm))
    kw.update(req.get("chat_template_kwargs") or {})
    text = env().from_string(src).render(**kw)
    if cfm:
        final = msgs[-1]["content"]
        if isinstance(final, list):
            final = [p["text"] for p in final][-1]
        final = final.strip()
        text = text[: text.rindex(final) + len(final)]
    return text


def main():
    root, corpus_path, families = sys.argv[1], sys.argv[2], sys.argv[3:]
    corpus = json.load(open(corpus_path, encoding="utf-8"))
    result = {}
    for fam in families:
        cfg = json.load(open(os.path.join(root, fam, "tokenizer_config.json"), encoding="utf-8"))
        src = cfg.get("chat_template")
        if isinstance(src, list):
            src = next((t["template"] for t in src if t["name"] == "default"), None)
        res = {}
        for c in corpus["chats"]:
            if not src:
                res[c["name"]] = None
                continue
            try:
                res[c["name"]] = render(cfg, src, c["request"])
            except jinja2.exceptions.TemplateError as e:
                res[c["name"]] = {"error": str(e)}
        result[fam] = res
    json.dump(result, sys.stdout, ensure_ascii=False)


main()
