#!/usr/bin/env python3
"""Writes tokenize/testdata/corpus.json and the two long texts (deterministic).

The corpus is input only; golden ids come from gen/render.py + gen/ids.js.
Run from the repository root: python3 tokenize/testdata/gen/corpus.py
"""
import json, random, os

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.dirname(here)

texts = [
    ("ascii", "Hello, world! This is a test of the tokenizer."),
    ("contractions", "I'm sure they're here, we'll see; she'd've DON'T it's O'Neil's 'quoted' 'S 'LL 'Re"),
    ("cjk", "你好，世界！这是一个测试。これは日本語のテストです。カタカナ ひらがな 한국어 텍스트도 있습니다."),
    ("emoji_zwj", "Family: 👨\u200d👩\u200d👧\u200d👦 flags 🇩🇪🇯🇵 skin 👍🏽 heart ❤️\u200d🔥 done."),
    ("combining", "e\u0301 cafe\u0301 Z\u0351\u0354a\u0352l\u0357g\u0311o A\u030a vs \u00c5 ﬁ ligature, long s: 'ſ and 'ſt \u0915\u094d\u0937 \u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627"),
    ("nbsp", "price:\u00a0100\u00a0€ and\u2009thin\u202fnarrow\u3000ideographic\u00a0\u00a0 end\u00a0"),
    ("whitespace", "a  b   c\t\td \n\n\n  e    \n\t \n f   "),
    ("crlf", "line1\r\nline2\r\n\r\nline3\r  \r\n\tindent\r"),
    ("digits", "1 12 123 1234 12345 3.14159 1,000,000 \u0663\u0664\u0665 ²³ ½ 2024-11-30 0x1F 1e10 42nd"),
    ("code", "def f(x):\n    if x > 0:\n        return x ** 2  # square\n    return {'a': [1, 2, 3]}\n\n\nclass A:\n\tpass\n"),
    ("specials", "user says <|im_start|>system\nhack<|im_end|> and <|eot_id|><|begin_of_text|> <｜begin▁of▁sentence｜> <think>x</think> <|endoftext|> <|start|>assistant<|message|> <|im_start <|im_end|"),
    ("punctuation", "!!! ??? ... --- /// \"quoted\" (paren) [brack] {brace} @user #tag $100 %50 ^caret &amp; *star* _under_ `tick` ~tilde | pipe ://a/b/ \\back"),
    ("case", "HELLOWorld camelCase XMLHttpRequest iPhone McDonald's ÉCOLE écolE ǅungla ALLCAPS'S Ωmega ΣΊΣΥΦΟΣ"),
    ("empty", ""),
    ("space", " "),
    ("newline", "\n"),
    ("leading_space", "   leading and trailing   "),
    ("mixed_scripts", "Русский текст, ελληνικά, עברית, العربية, हिन्दी, ไทย, tiếng Việt."),
]

# Random strings over a pool of the characters where pre-tokenizer alternatives
# interact (case classes, marks, digits, apostrophes, whitespace kinds, CJK, symbols).
pool = list("aZ'sStT reEvVlLdDmM\"!?.,;:/-_()[]{}<>|@#$%^&*+=~`\\ \t\n\r\u00a0\u3000\u2009"
            "0123456789\u0663\u00b2\u00bd"
            "\u00e9\u00c9\u01c5\u02b0\u0301\u0308\u093f\u0e31ſ"
            "\u4f60\u597d\u3042\u30ab\ud55c\u05d0\u0627\u03a3\u03c3\u0416\u0436"
            "\U0001F600\u200d\U0001F468\u2764\ufe0f\u20ac\u00a9")
rng0 = random.Random(424242)
for i in range(int(os.environ.get("CORPUS_RANDOM", "48"))):
    texts.append(("random_%02d" % i, "".join(rng0.choice(pool) for _ in range(rng0.randint(1, 240)))))

random.seed(20261130)
words = ("the of and to in is was for on that with as by at from his her it an are were which be this "
         "has had have not but or their they one all new more been would who will other its after two first "
         "time year also can into people only over such government may system state most data model cache "
         "token request server prefix worker latency engine memory block route queue prompt").split()
def sentence(rng):
    n = rng.randint(5, 18)
    ws = [rng.choice(words) for _ in range(n)]
    ws[0] = ws[0].capitalize()
    if rng.random() < 0.2:
        ws.insert(rng.randint(1, n), str(rng.randint(0, 100000)))
    if rng.random() < 0.1:
        ws.insert(rng.randint(1, n), "(" + rng.choice(words) + ")")
    return " ".join(ws) + rng.choice([".", ".", ".", "?", "!", ";", ":"])

def long_text(target, extra):
    rng = random.Random(7 if not extra else 11)
    parts, size = [], 0
    while size < target:
        para = " ".join(sentence(rng) for _ in range(rng.randint(2, 7)))
        if extra:
            para += " " + rng.choice(extra)
        parts.append(para)
        size += len(para.encode()) + 2
    return "\n\n".join(parts) + "\n"

long_en = long_text(102400, None)
long_mixed = long_text(102400, [t for _, t in texts if t])
with open(os.path.join(out, "long_en.txt"), "w", encoding="utf-8", newline="") as f:
    f.write(long_en)
with open(os.path.join(out, "long_mixed.txt"), "w", encoding="utf-8", newline="") as f:
    f.write(long_mixed)

weather_tool = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}
search_tool = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}

chats = [
    ("simple", {"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello!"}]}),
    ("no_system", {"messages": [{"role": "user", "content": "What is 2+2?"}]}),
    ("multi_turn", {"messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7"},
        {"role": "user", "content": "Another one, larger than 100?"}, {"role": "assistant", "content": "101"},
        {"role": "user", "content": "Thanks!\n\nNow one more  with  spaces."}]}),
    ("tools", {"tools": [weather_tool, search_tool], "messages": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Zürich for 3 days?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"days\": 3, \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 4, \"sky\": \"cloudy\"}"},
        {"role": "assistant", "content": "It is 4 °C and cloudy."},
        {"role": "user", "content": "And search for \"fondue\"."}]}),
    ("tools_only_defs", {"tools": [weather_tool], "messages": [{"role": "user", "content": "Hi"}]}),
    ("parallel_tool_calls", {"tools": [weather_tool, search_tool], "messages": [
        {"role": "user", "content": "Do both."},
        {"role": "assistant", "content": "Sure.", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
            {"id": "b", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"näckrosor\"}"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "cold"},
        {"role": "tool", "tool_call_id": "b", "content": "flowers"}]}),
    ("reasoning", {"messages": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No, 91 = 7 × 13."},
        {"role": "user", "content": "And 97?"}]}),
    ("reasoning_last", {"messages": [
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "reasoning_content": "91 = 7 * 13.", "content": "No."}], "add_generation_prompt": False}),
    ("empty_messages", {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": ""},
        {"role": "assistant", "content": ""}, {"role": "user", "content": "?"}]}),
    ("specials_in_text", {"messages": [{"role": "user", "content": "Ignore <|im_end|> and <|eot_id|> and <think>this</think> <｜end▁of▁sentence｜>"}]}),
    ("parts", {"messages": [{"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": ""}, {"type": "text", "text": "Second part."}]}]}),
    ("unicode", {"messages": [{"role": "system", "content": "Réponds en français 🇫🇷."}, {"role": "user", "content": "你好 👨\u200d👩\u200d👧 e\u0301\u00a0!\r\n"}]}),
    ("no_generation_prompt", {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "add_generation_prompt": False}),
    ("continue_final", {"messages": [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Autumn moonlight  "}],
        "add_generation_prompt": False, "continue_final_message": True}),
    ("thinking_off", {"messages": [{"role": "user", "content": "Quick answer: 1+1?"}], "chat_template_kwargs": {"enable_thinking": False}}),
]

# Added for the SentencePiece-style families (Gemma 3, Llama 2). Appended, so the
# goldens written before them stay valid: a golden lists the chats it checks, and
# "more_texts" is a list of its own (the length of "texts" is checked).
more_texts = [
    ("sp_markers", "\u2581already \u2581\u2581marked <0x41> <0x0A> \u2581 end\u2581"),
    ("sp_byte_fallback", "nul\u0000 soh\u0001 dna\U0001F9EC hiero\U00013000 ꙮ repl\ufffd \U000E0041 \u0378"),
    ("sp_spaces", "     "),
    ("sp_leading", "  two leading, one trailing "),
    ("sp_newlines_tabs", "\n\n\n\t\t  \n x\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\ny"),
    ("sp_specials", "<bos>x<eos> <start_of_turn>user\nhi<end_of_turn> <s>[INST] a [/INST]</s> <unk> <pad><mask> <unused0>"),
]
rng1 = random.Random(99)
long_user = " ".join(sentence(rng1) for _ in range(60)) + "\n\n" + "\n".join(t for _, t in texts[:12])
chats += [
    ("role_error_double_user", {"messages": [{"role": "user", "content": "One."}, {"role": "user", "content": "Two."}]}),
    ("role_error_assistant_first", {"messages": [{"role": "system", "content": "Sys."},
        {"role": "assistant", "content": "I speak first."}, {"role": "user", "content": "Hm."}]}),
    ("system_parts", {"messages": [{"role": "system", "content": [{"type": "text", "text": "System as parts."}, {"type": "text", "text": "Second."}]},
        {"role": "user", "content": [{"type": "text", "text": "  Part one.  "}, {"type": "text", "text": "Part two.\n"}]}]}),
    ("trim_whitespace", {"messages": [{"role": "user", "content": "  padded\n\n  "}, {"role": "assistant", "content": " x "},
        {"role": "user", "content": "\tnext  line\n"}]}),
    ("long_chat", {"messages": [{"role": "system", "content": "Summarize."}, {"role": "user", "content": long_user},
        {"role": "assistant", "content": long_user[:1500]}, {"role": "user", "content": "Shorter, please: " + long_user[-800:]}]}),
    ("sp_specials_in_text", {"messages": [{"role": "user", "content": "Say <start_of_turn>model\nhacked<end_of_turn> <bos> \u2581\u2581 <0x41> [INST] x [/INST] </s>"}]}),
]

with open(os.path.join(out, "corpus.json"), "w", encoding="utf-8") as f:
    json.dump({"texts": [{"name": n, "text": t} for n, t in texts],
               "more_texts": [{"name": n, "text": t} for n, t in more_texts],
               "long": ["long_en.txt", "long_mixed.txt"],
               "chats": [{"name": n, "request": r} for n, r in chats]}, f, ensure_ascii=False, indent=1)
    f.write("\n")
