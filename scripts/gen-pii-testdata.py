#!/usr/bin/env python3
"""Writes classify/testdata/pii.jsonl: labelled PII and secret spans with look-alike
negatives (bad checksums, never-issued SSNs, order numbers, UUIDs, hashes, dates,
version strings, public keys, non-JWT base64). Deterministic (seeded); independent of
the Go recognizers, so the set measures them rather than mirrors them.

Usage: python3 scripts/gen-pii-testdata.py > classify/testdata/pii.jsonl
"""
import base64, json, random, string

rng = random.Random(26)

def luhn_digit(body):
    s = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d *= 2
            if d > 9: d -= 9
        s += d
    return str((10 - s % 10) % 10)

def card(prefix, length, valid=True):
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    d = luhn_digit(body)
    if not valid:
        d = str((int(d) + rng.randint(1, 9)) % 10)
    n = body + d
    style = rng.choice(["plain", "space", "dash"])
    if style == "plain" or length not in (16,):
        return n
    sep = " " if style == "space" else "-"
    return sep.join(n[i:i+4] for i in range(0, 16, 4))

IBAN = {"DE": (22, "8n10n"), "GB": (22, "4a6n8n"), "FR": (27, "10n11c2n"), "NL": (18, "4a10n"), "ES": (24, "20n"), "IT": (27, "1a10n12c"), "CH": (21, "5n12c"), "BE": (16, "12n")}

def bban(spec):
    out, num = "", ""
    for ch in spec:
        if ch.isdigit(): num += ch; continue
        n = int(num); num = ""
        pool = string.digits if ch == "n" else string.ascii_uppercase if ch == "a" else string.ascii_uppercase + string.digits
        out += "".join(rng.choice(pool) for _ in range(n))
    return out

def iban(valid=True):
    cc = rng.choice(sorted(IBAN))
    b = bban(IBAN[cc][1])
    rearr = b + cc + "00"
    num = int("".join(str(int(c, 36)) for c in rearr))
    chk = 98 - num % 97
    if not valid:
        chk = (chk + rng.randint(1, 50)) % 97 or 3
    s = f"{cc}{chk:02d}{b}"
    if rng.random() < 0.5:
        s = " ".join(s[i:i+4] for i in range(0, len(s), 4))
    return s

def ssn(valid=True):
    while True:
        a, g, s = rng.randint(1, 899), rng.randint(1, 99), rng.randint(1, 9999)
        if a != 666: break
    if not valid:
        kind = rng.choice(["000", "666", "9xx", "g00", "s0000"])
        if kind == "000": a = 0
        elif kind == "666": a = 666
        elif kind == "9xx": a = rng.randint(900, 999)
        elif kind == "g00": g = 0
        else: s = 0
    return f"{a:03d}-{g:02d}-{s:04d}"

def phone():
    area = rng.randint(2, 9) * 100 + rng.randint(0, 99)
    ex = rng.randint(2, 9) * 100 + rng.randint(0, 99)
    line = rng.randint(0, 9999)
    f = rng.choice(["({a}) {e}-{l:04d}", "{a}-{e}-{l:04d}", "{a}.{e}.{l:04d}", "+1 {a} {e} {l:04d}", "+1-{a}-{e}-{l:04d}",
                    "+44 20 {x} {y}", "+49 30 {z}", "+33 1 {p}"])
    return f.format(a=area, e=ex, l=line, x=rng.randint(1000, 9999), y=rng.randint(1000, 9999),
                    z=rng.randint(1000000, 99999999), p=" ".join(f"{rng.randint(10, 99)}" for _ in range(4)))

def email():
    user = rng.choice(["jane.doe", "j.smith", "ops+alerts", "first_last", "a.b-c", "mike77", "support"])
    dom = rng.choice(["example.com", "mail.example.org", "corp.co.uk", "uni-berlin.de", "startup.io"])
    return f"{user}@{dom}"

def ipv4():
    return ".".join(str(rng.randint(1, 254)) for _ in range(4))

def aws():
    return rng.choice(["AKIA", "ASIA"]) + "".join(rng.choice(string.ascii_uppercase + "234567") for _ in range(16))

def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

def jwt():
    h = b64url(json.dumps({"alg": rng.choice(["HS256", "RS256"]), "typ": "JWT"}).encode())
    p = b64url(json.dumps({"sub": str(rng.randint(1, 10**9)), "iat": rng.randint(10**9, 2 * 10**9)}).encode())
    return f"{h}.{p}.{b64url(bytes(rng.randrange(256) for _ in range(32)))}"

def pem(kind="RSA PRIVATE KEY"):
    body = "\n".join(base64.b64encode(bytes(rng.randrange(256) for _ in range(48))).decode() for _ in range(3))
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----"

POS = {
    "email": (email, ["Contact {} for access.", "Send the report to {} by Friday.", "my email is {}", "cc: {}; thanks"]),
    "phone": (phone, ["Call me at {} tomorrow.", "Phone: {}", "reach the desk on {} after 5pm", "mobile {}."]),
    "credit_card": (lambda: card(rng.choice(["4", "51", "55", "2221", "34", "37", "6011"]), 0), ["Card number {} exp 09/27", "charge {} please", "my card: {}."]),
    "iban": (iban, ["Wire it to {} today.", "IBAN: {}", "account {} (personal)"]),
    "us_ssn": (ssn, ["SSN {} on file", "social security number: {}.", "my ssn is {}"]),
    "ipv4": (ipv4, ["the server at {} is down", "ssh admin@{} failed", "client IP {}, port 443"]),
    "aws_access_key": (aws, ["aws_access_key_id = {}", "export AWS_ACCESS_KEY_ID={}", "key {} leaked"]),
    "jwt": (jwt, ["Authorization: Bearer {}", "token={}", "use this jwt {} for the test"]),
    "private_key": (pem, ["here is my key:\n{}\nplease fix", "{}", "config:\n{}"]),
}

def card_pos():
    p = rng.choice(["4", "51", "55", "2221", "34", "37", "6011"])
    length = 15 if p in ("34", "37") else 16
    return card(p, length)
POS["credit_card"] = (card_pos, POS["credit_card"][1])

def bad_card():
    c = card_pos()
    return c[:-1] + str((int(c[-1]) + rng.randint(1, 9)) % 10)

def uuid():
    h = "".join(rng.choice("0123456789abcdef") for _ in range(32))
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

NEG = [
    lambda: "Card number {} was declined".format(bad_card()),
    lambda: "card {} is invalid".format(card(rng.choice(["4", "51", "6011"]), 16, valid=False)),
    lambda: "IBAN {} failed the check".format(iban(valid=False)),
    lambda: "SSN {} is not valid".format(ssn(valid=False)),
    lambda: "Order #{} shipped".format(rng.randint(10**9, 10**10 - 1)),
    lambda: "order number {}-{}".format(rng.randint(100, 999), rng.randint(1000000, 9999999)),
    lambda: "request id {}".format(uuid()),
    lambda: "commit {} fixed it".format("".join(rng.choice("0123456789abcdef") for _ in range(40))),
    lambda: "sha256 {}".format("".join(rng.choice("0123456789abcdef") for _ in range(64))),
    lambda: "meeting on {}-{:02d}-{:02d} at {:02d}:{:02d}".format(rng.randint(2000, 2030), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59)),
    lambda: "born {:02d}/{:02d}/{}".format(rng.randint(1, 12), rng.randint(1, 28), rng.randint(1940, 2010)),
    lambda: "upgrade to version {}.{}.{}.{}.{}".format(*(rng.randint(0, 20) for _ in range(5))),
    lambda: "bad address {}.{}.{}.{}".format(rng.randint(256, 999), rng.randint(0, 255), rng.randint(0, 255), rng.randint(0, 255)),
    lambda: "the ratio was {}.{} to {}.{}".format(rng.randint(1, 99), rng.randint(0, 99), rng.randint(1, 99), rng.randint(0, 99)),
    lambda: "key id AKIA{} is the example placeholder".format("".join(rng.choice(string.ascii_lowercase) for _ in range(16))),
    lambda: "AKIA{} is too short".format("".join(rng.choice(string.ascii_uppercase) for _ in range(10))),
    lambda: "not a token eyJ{}.{}.{}".format(*("".join(rng.choice(string.ascii_letters) for _ in range(20)) for _ in range(3))),
    lambda: pem("PUBLIC KEY") + " is public",
    lambda: "-----BEGIN CERTIFICATE-----\nMIIB{}\n-----END CERTIFICATE-----".format("".join(rng.choice(string.ascii_letters) for _ in range(40))),
    lambda: "user@localhost is a local account",
    lambda: "write to a..b@example.com? no",
    lambda: "Invoice {} due".format(rng.randint(10**12, 10**13)),
    lambda: "tracking {}".format("1Z" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(16))),
    lambda: "ISBN 978-{}-{}-{}-{}".format(rng.randint(0, 9), rng.randint(100, 999), rng.randint(10000, 99999), rng.randint(0, 9)),
    lambda: "the price rose 12.5% to $1,234.56 on 2024-03-01",
    lambda: "temperature 23.4 C, humidity 55.1",
    lambda: "DE00 1234 5678 9012 3456 78 is a template",
    lambda: "room 4111 1111 and extension 1111 1111",
]

rows = []
for typ, (gen, tmpls) in POS.items():
    for i in range(40):
        v = gen()
        t = rng.choice(tmpls)
        pre, post = t.split("{}")
        text = pre + v + post
        spans = [{"type": typ, "start": len(pre.encode()), "end": len((pre + v).encode())}]
        if i % 8 == 0:  # mixed rows: a second PII in the same text
            v2 = email() if typ != "email" else ipv4()
            t2 = "email" if typ != "email" else "ipv4"
            s2 = len((text + " and ").encode())
            text = text + " and " + v2
            spans.append({"type": t2, "start": s2, "end": s2 + len(v2.encode())})
        rows.append({"text": text, "spans": spans})
for i in range(360):
    rows.append({"text": NEG[i % len(NEG)](), "spans": []})
rng.shuffle(rows)
for r in rows:
    print(json.dumps(r, ensure_ascii=False))
