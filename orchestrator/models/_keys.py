"""The API key: read for a call and checked, what makes one unusable, and how it is kept out of
every text Ratchet writes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus

from orchestrator.errors import ConfigurationError, ModelCallError
from orchestrator.settings import env_secret

if TYPE_CHECKING:
    from orchestrator.models.base import Model

#: Where the adapters read the API key when none is passed, at each call.
API_KEY_VAR = "OPENAI_API_KEY"

# sk-, sk-proj-, and the masked forms OpenAI echoes back ("sk-abc***wxyz"), URL-encoded or not,
# or inside a JSON string ("/" escaped as "\/").
_KEY_PATTERN = re.compile(r"sk-[A-Za-z0-9_*\-/+=%\\]+")
# A key's prefix: one or two words of letters, each ending in "-" or "_" ("sk-", "sk-proj-",
# a gateway's "gw-", "gsk_"): the key without it is still the secret part.
_KEY_PREFIX = re.compile(r"^[^\W\d_]+[-_](?:[^\W\d_]+[-_])?")
#: A part of the key shorter than this is not masked on its own: it would match ordinary text.
_MIN_SECRET_PART = 8
#: The key's last characters a provider may quote alone ("the key ending ..."), masked on their own.
_TAIL = 10
#: The asterisks of a masked echo: a key's head and tail around them ("gw-abc***wxyz").
_STARS = re.compile(r"\*{3,}")
#: The key's characters a masked echo must show for it to be masked whole: fewer could be chance.
_MIN_MASKED_ENDS = 4


def redact(text: str, secret: str | None = None) -> str:
    """`text` without API keys: anything like `sk-...` becomes `sk-***`, and `secret` `***`.

    `secret`, of any form (an OpenAI key, a gateway's token without `sk-`), is also found
    without its prefix (`sk-`, `sk-proj-`, a gateway's `gw-`: one or two words of letters, each
    ending in "-" or "_"), by its last ten characters alone, in any letter
    case, URL-encoded (as `quote` and `quote_plus` write it), and masked but for its ends (its
    head and tail around asterisks, as a provider echoes a refused key): the forms a provider or
    a proxy may echo."""
    if secret and len(secret) >= 4:
        text = _masked_echoes(_secret_pattern(secret).sub("***", text), secret)
    return _KEY_PATTERN.sub("sk-***", text)


def _secret_pattern(secret: str) -> re.Pattern[str]:
    bare = _KEY_PREFIX.sub("", secret)
    parts = {secret[3:] if secret.startswith("sk-") else "", bare, secret[-_TAIL:]}
    parts = {secret} | {p for p in parts if len(p) >= _MIN_SECRET_PART}
    # As sent, URL-encoded, and as a JSON string may carry it (a proxy's error body quoted raw).
    forms = {form for p in parts for form in (p, quote(p), quote(p, safe=""), quote_plus(p), p.replace("/", "\\/"))}
    # Longest first, so a form that contains another is masked whole.
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)), re.IGNORECASE)


def _masked_echoes(text: str, secret: str) -> str:
    """`text` with each masked echo of `secret` as `***` ("(gw-abc***wxyz)." -> "(***)."), any
    other run of asterisks as it is. The characters before the asterisks end in a start of the
    key (or of its part without its prefix), those after start with an end of it, in any case,
    and they are at least _MIN_MASKED_ENDS together. Only as many characters around the asterisks
    as the key has are read, so a long text costs no more than its asterisks."""
    key = secret.lower()
    starts = (key, _KEY_PREFIX.sub("", key))
    kept: list[str] = []
    done = 0
    for stars in _STARS.finditer(text):
        before = text[max(done, stars.start() - len(key)) : stars.start()].lower()
        after = text[stars.end() : stars.end() + len(key)].lower()
        head = next((n for n in range(len(before), 0, -1) if any(s.startswith(before[-n:]) for s in starts)), 0)
        tail = next((n for n in range(len(after), 0, -1) if key.endswith(after[:n])), 0)
        if head + tail >= _MIN_MASKED_ENDS:
            kept += [text[done : stars.start() - head], "***"]
            done = stars.end() + tail
    return "".join([*kept, text[done:]])


def key_problem(api_key: str) -> str | None:
    """What makes `api_key` unusable in an HTTP header (None: nothing). Never quotes the key."""
    if api_key.isascii() and api_key.isprintable() and " " not in api_key:
        return None
    if any(c.isspace() for c in api_key):
        return "whitespace or a line break (often a newline left at the end by the file or secret it came from)"
    if not api_key.isascii():
        return "a character that is not ASCII (often a quote or a dash pasted from a document)"
    return "a control character"


def call_key(model: Model, passed: str | None, variables: Sequence[str]) -> str:
    """The API key of one call to `model`: `passed`, else the first of
    `variables` that is set (each may be given as a file, `..._FILE`), read now, so a key changed
    on the workers is used without a restart. A final `AuthenticationError` instead when there
    is none, its file cannot be read, or it cannot go in a header; its text never quotes the key."""
    try:
        source, api_key = (None, passed) if passed else _from_env(variables)
    except ConfigurationError as exc:  # a ..._FILE unreadable, or both a variable and its file set
        raise ModelCallError(f"{model.describe()}: {exc}", retryable=False, kind="AuthenticationError") from None
    if not api_key:
        first, *others = variables
        also = "".join(f"{other}; or " for other in others)
        raise ModelCallError(
            f"{model.describe()}: no API key: set {first} (or {also}{first}_FILE, a file holding it) in the "
            "environment of the workers (it is read at each call, so no restart is needed)",
            retryable=False,
            kind="AuthenticationError",
        )
    if (problem := key_problem(api_key)) is not None:
        if source is None:
            where, fix = "the API key passed as api_key=", "pass the key exactly as issued"
        else:
            where = f"the API key in {source}"
            fix = f"set {source} again, exactly as issued, in the environment of the workers"
        raise ModelCallError(
            f"{model.describe()}: {where} has {problem}; a key is printable ASCII without spaces: {fix}",
            retryable=False,
            kind="AuthenticationError",
        )
    return api_key


def _from_env(variables: Sequence[str]) -> tuple[str | None, str | None]:
    """The first of `variables` set and its key, read in order (a later one is not read at all)."""
    for variable in variables:
        if api_key := env_secret(variable):
            return variable, api_key
    return None, None
