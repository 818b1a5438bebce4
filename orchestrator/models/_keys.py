"""The API key: what makes one unusable, and how it is kept out of every text Ratchet writes."""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus

# sk-, sk-proj-, and the masked forms OpenAI echoes back ("sk-abc***wxyz").
_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_*\-]+")
# "sk-" or "sk-proj-" (any one word): the key without it is still the secret part.
_KEY_PREFIX = re.compile(r"^sk-(?:[^\W\d_]+-)?")
#: A part of the key shorter than this is not masked on its own: it would match ordinary text.
_MIN_SECRET_PART = 8


def redact(text: str, secret: str | None = None) -> str:
    """`text` without API keys: anything like `sk-...` becomes `sk-***`, and `secret` `***`.

    `secret` is also found without its `sk-` (or `sk-proj-`) prefix, in any letter case, and
    URL-encoded (as `quote` and `quote_plus` write it), the forms a provider or a proxy may echo."""
    if secret and len(secret) >= 4:
        text = _secret_pattern(secret).sub("***", text)
    return _KEY_PATTERN.sub("sk-***", text)


def _secret_pattern(secret: str) -> re.Pattern[str]:
    bare = _KEY_PREFIX.sub("", secret)
    parts = {secret} | {p for p in (secret[3:] if secret.startswith("sk-") else "", bare) if len(p) >= _MIN_SECRET_PART}
    forms = {form for p in parts for form in (p, quote(p), quote(p, safe=""), quote_plus(p))}
    # Longest first, so a form that contains another is masked whole.
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)), re.IGNORECASE)


def key_problem(api_key: str) -> str | None:
    """What makes `api_key` unusable in an HTTP header (None: nothing). Never quotes the key."""
    if api_key.isascii() and api_key.isprintable() and " " not in api_key:
        return None
    if any(c.isspace() for c in api_key):
        return "whitespace or a line break (often a newline left at the end by the file or secret it came from)"
    if not api_key.isascii():
        return "a character that is not ASCII (often a quote or a dash pasted from a document)"
    return "a control character"
