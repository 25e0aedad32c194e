"""A web page as web_read_page answers it: its text, in one forward pass over the HTML.

The runner reads a page with this when a case fetches one itself (a case with a network).
The worker's gateway parses pages with libxml2 (gate_service/page_reader.py) and scans each
one with this first: for the shape that would make libxml2 quadratic (a tag of very many
attributes), and for the text where libxml2 would be slow or give up. A page is hostile
input, up to 2 MiB of a server's choosing. Every search here moves forward from where the
last one of its kind stopped, each byte is read a bounded number of times, and no regular
expression runs over the page (one folds white space, which is linear), so the time is
linear in the page's size (tests/unit/test_page_text.py times 2 MiB of each known worst
case).

What is a tag follows HTML's tokenizer (the WHATWG standard), as libxml2 2.14 does, since
the gateway must never see fewer attributes than libxml2 builds (a property test holds the
two together): a start tag's attributes are read as it reads them (a quoted value may hold
``>``, an attribute may start with ``=``); comments end at ``-->``, ``--!>``, or at once
(``<!-->``); ``<!...>``, ``<?...>`` and ``</`` not followed by a letter end at the first
``>``; the content of script (with its ``<!--`` escapes), style, iframe, noembed, noframes,
xmp, title, textarea and plaintext is text up to its end tag, not markup, except after a
start tag that ends ``/>``, which libxml2 reads as an empty element; a tag that the page's
end cuts is dropped.

The text: what lies outside tags, without the content of script, style, noscript, template,
iframe, noembed and noframes; every tag except phrasing ones (``b``, ``a``, ``span``, ...)
and those of hidden elements separates words; character references decoded; white space
folded to one space; at most MAX_PAGE_CHARS characters.

May import the standard library only: the runner loads this.
"""

from __future__ import annotations

import html
import re
from typing import Final

from .gateway_wire import MAX_PAGE_CHARS

# HTML's white space (a CR is a line feed once the input is read).
_WS: Final = b" \t\n\r\f"
_WS_BYTES: Final = frozenset(_WS)
# Elements whose text is not shown (their content is dropped) and phrasing elements, which
# do not separate the words around them; gate_service/page_reader.py says the same to
# libxml2's tree.
HIDDEN: Final = frozenset(
    {"script", "style", "noscript", "template", "iframe", "noembed", "noframes"}
)
PHRASING: Final = frozenset(
    {
        "a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em",
        "font", "i", "ins", "kbd", "mark", "nobr", "q", "s", "samp", "small", "span",
        "strike", "strong", "sub", "sup", "time", "tt", "u", "var", "wbr",
    }
)  # fmt: skip
# Elements whose content the tokenizer reads as text up to their end tag: shown or not.
_RAW_SHOWN: Final = frozenset({b"xmp", b"title", b"textarea"})
_RCDATA: Final = frozenset({b"title", b"textarea"})  # their references are decoded
_RAW_HIDDEN: Final = frozenset({b"script", b"style", b"iframe", b"noembed", b"noframes"})
# Elements parsed as markup whose content is hidden all the same: counted, not skipped.
_NESTED_HIDDEN: Final = frozenset({b"noscript", b"template"})
_PHRASING: Final = frozenset(name.encode() for name in PHRASING)
_SPECIAL: Final = _RAW_SHOWN | _RAW_HIDDEN | _NESTED_HIDDEN | {b"plaintext"}
# Tags that do not separate words: phrasing ones, and those of hidden elements (whose text
# is gone, so "a<script>...</script>b" reads "ab" as a browser shows it).
_JOINING: Final = _PHRASING | _RAW_HIDDEN | _NESTED_HIDDEN
_LONGEST_NAME: Final = 10  # no name above is longer: a longer one is none of them


def _table(chars: bytes, to: bytes) -> bytes:
    return bytes.maketrans(chars, to * len(chars))


# Translations of the page, each as long as it: in the lowered page through _OPENS, every
# "<" that opens markup ("<" and a letter, "/", "!" or "?") reads "<a"; through the others
# ">" also stands for each byte that ends a tag's name, an attribute's name, or an unquoted
# value, so one find() looks for all of them at once.
_OPENS: Final = _table(bytes(range(ord("a"), ord("z") + 1)) + b"/!?", b"a")
_NAME_ENDS: Final = _table(_WS + b"/", b">")
_ATTRIBUTE_ENDS: Final = _table(_WS + b"/=", b">")
_VALUE_ENDS: Final = _table(_WS, b">")

_DIGITS: Final = "0123456789"
_HEX_DIGITS: Final = "0123456789abcdefABCDEF"
_ALNUM: Final = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_SPACES: Final = re.compile(r"\s+")


class Scan:
    """A page read once: its text, not yet decoded, and the most attributes one start tag
    has (each name and each ``/``-separated token counted, so never fewer than a parser
    builds)."""

    __slots__ = ("pieces", "widest")

    def __init__(self, pieces: list[bytes], widest: int) -> None:
        self.pieces = pieces
        self.widest = widest

    def text(self, limit: int = MAX_PAGE_CHARS) -> str:
        # A NUL is U+FFFD, as an HTML parser reads it.
        raw = b"".join(self.pieces).decode("utf-8", errors="replace").replace("\x00", "\ufffd")
        return _decoded(fold(raw), limit)


def page_text(page: str | bytes, limit: int = MAX_PAGE_CHARS) -> str:
    """The text web_read_page answers for ``page`` (bytes are read as UTF-8)."""
    return scan(page).text(limit)


def fold(text: str) -> str:
    """``text`` with each run of white space one space, none at either end."""
    return _SPACES.sub(" ", text).strip()


def _skip(data: bytes, pos: int, chars: bytes) -> int:
    """The first position at or after ``pos`` whose byte is not in ``chars``."""
    while True:
        chunk = data[pos : pos + 64]
        rest = chunk.lstrip(chars)
        if rest or len(chunk) < 64:
            return pos + len(chunk) - len(rest)
        pos += 64


def _names(segment: bytes) -> int:
    """How many attribute names at most lie in ``segment`` (no ``=`` in it)."""
    if b"/" in segment:
        segment = segment.replace(b"/", b" ")
    return len(segment.split())


def _read(data: bytes) -> Scan:
    """The loop of scan(): one turn a tag, in one function for speed.

    Each ``*_at`` is where its byte (or string) is next, at or after the last place it was
    looked for from: places only grow, so each byte is searched for each of them once however
    often it is asked (-2: not yet looked for, -1: nowhere further)."""
    low = data.lower()
    opens = low.translate(_OPENS).find
    name_end_of = data.translate(_NAME_ENDS).find
    attribute_end_of = data.translate(_ATTRIBUTE_ENDS).find
    value_end_of = data.translate(_VALUE_ENDS).find
    find = data.find
    n = len(data)
    pieces: list[bytes] = []
    add = pieces.append
    joining, special, nested_hidden = _JOINING, _SPECIAL, _NESTED_HIDDEN
    widest = hidden = pos = 0
    gt_at = eq_at = dashes_at = bang_at = -2
    while True:
        lt = opens(b"<a", pos)
        if lt < 0:
            if not hidden:
                add(data[pos:])
            break
        if lt > pos and not hidden:
            add(data[pos:lt])
        kind = data[lt + 1]
        closing = kind == 0x2F  # "</"
        start = lt + 2 if closing else lt + 1
        if not (0x61 <= low[start] <= 0x7A if start < n else False):
            # not a tag: a comment, a doctype, a bogus comment, or "</" with no letter
            if kind == 0x21 and data.startswith(b"--", lt + 2):
                start = lt + 4
                if data.startswith(b">", start):  # "<!-->"
                    pos = start + 1
                    continue
                if data.startswith(b"->", start):  # "<!--->"
                    pos = start + 2
                    continue
                if dashes_at < start and dashes_at != -1:
                    dashes_at = find(b"-->", start)
                if bang_at < start and bang_at != -1:
                    bang_at = find(b"--!>", start)
                if dashes_at >= 0 and (bang_at < 0 or dashes_at < bang_at):
                    pos = dashes_at + 3
                elif bang_at >= 0:
                    pos = bang_at + 4
                else:
                    break
                continue
            if closing and start >= n:  # "</" at the end: text
                if not hidden:
                    add(b"</")
                break
            if closing and data[start] == 0x3E:  # "</>": nothing
                pos = start + 1
                continue
            if gt_at < start and gt_at != -1:  # to the first ">"
                gt_at = find(b">", start)
            if gt_at < 0:
                break
            pos = gt_at + 1
            continue
        name_end = name_end_of(b">", start)
        if name_end < 0:  # the page ends in the tag: dropped
            break
        name = low[start:name_end] if name_end - start <= _LONGEST_NAME else b""
        attributes = 0
        unquoted_end = -1
        if data[name_end] == 0x3E:
            end = name_end
        else:
            # The tag's end: the first ">" when no "=" comes before it (a quote matters
            # only after one); else attribute by attribute, as the docstring says.
            at = name_end
            after_name = False
            while True:
                if gt_at < at and gt_at != -1:
                    gt_at = find(b">", at)
                if gt_at < 0:
                    end = -1
                    break
                if eq_at < at and eq_at != -1:
                    eq_at = find(b"=", at)
                if eq_at < 0 or eq_at > gt_at:
                    end = gt_at
                    attributes += _names(data[at:end])
                    break
                segment = data[at:eq_at]
                named = segment.rstrip(_WS)
                if named:
                    attributes += len(segment.split()) if b"/" not in segment else _names(segment)
                if named[-1:] == b"/" or (not named and not after_name):
                    # "=" starts a name, which runs to white space, "/", ">" or a "="
                    attributes += 1
                    at = attribute_end_of(b">", eq_at + 1)
                    if at < 0:
                        end = -1
                        break
                    after_name = True
                    continue
                value = eq_at + 1
                if value < n and data[value] in _WS_BYTES:
                    value = _skip(data, value, _WS)
                if value >= n:
                    end = -1
                    break
                quote = data[value]
                if quote == 0x3E:  # "=>": no value, and the tag ends
                    end = value
                    break
                if quote == 0x22 or quote == 0x27:
                    close = find(data[value : value + 1], value + 1)
                    if close < 0:
                        end = -1
                        break
                    at = close + 1
                else:
                    at = unquoted_end = value_end_of(b">", value)
                    if at < 0:
                        end = -1
                        break
                after_name = False
            if end < 0:
                break
        pos = end + 1
        if closing:
            if hidden and name in nested_hidden:
                hidden -= 1
            if not hidden and name not in joining:
                add(b" ")
            continue
        if attributes > widest:
            widest = attributes
        if not hidden and name not in joining:
            add(b" ")
        if name not in special:
            continue
        if data[end - 1] == 0x2F and end - 1 >= name_end and unquoted_end != end:
            # "/>" (not the end of an unquoted value): libxml2 closes the element there,
            # a raw text one too, where HTML would read its text
            continue
        if name in nested_hidden:
            hidden += 1
        elif name in _RAW_SHOWN or name in _RAW_HIDDEN:
            close = _script_end(low, pos) if name == b"script" else _raw_text_end(low, name, pos)
            if name in _RAW_SHOWN and not hidden:
                text = data[pos : close if close >= 0 else n]
                add(text if name in _RCDATA else text.replace(b"&", b"&amp;"))
            if close < 0:
                break
            pos = close  # its end tag is read as one next
        elif name == b"plaintext":
            if not hidden:
                add(data[pos:].replace(b"&", b"&amp;"))  # its "&" is no reference
            break
    return Scan(pieces, widest)


def _raw_text_end(low: bytes, name: bytes, pos: int) -> int:
    """Where the end tag of raw text element ``name`` starts, at or after ``pos``."""
    needle = b"</" + name
    while True:
        at = low.find(needle, pos)
        if at < 0:
            return -1
        follows = low[at + len(needle) : at + len(needle) + 1]
        if not follows or follows in _WS + b"/>":
            return at
        pos = at + 1


class _Ahead:
    """Where each needle is next in ``low`` at or after a place, remembered (places only
    grow, so each byte is searched for each needle once); an end or start tag's name must
    be followed by white space, "/" or ">" (or the page's end)."""

    def __init__(self, low: bytes) -> None:
        self.low = low
        self.at: dict[bytes, int] = {}

    def find(self, needle: bytes, pos: int) -> int:
        at = self.at.get(needle, -2)
        if at == -1 or at >= pos:
            return at
        self.at[needle] = at = self.low.find(needle, pos)
        return at

    def tag(self, needle: bytes, pos: int) -> int:
        while True:
            at = self.find(needle, pos)
            if at < 0:
                return -1
            follows = self.low[at + len(needle) : at + len(needle) + 1]
            if not follows or follows in _WS + b"/>":
                return at
            pos = at + 1


def _script_end(low: bytes, pos: int) -> int:
    """Where a script's end tag starts, at or after ``pos``, by HTML's script data states
    (which libxml2 follows): ``<!--`` escapes the script and ``-->`` ends that, and inside
    an escape a ``<script`` makes ``</script`` end only itself, not the script."""
    ahead = _Ahead(low)
    state = 0  # 0: script data, 1: escaped, 2: escaped twice
    while True:
        end = ahead.tag(b"</script", pos)
        if state == 0:
            escape = ahead.find(b"<!--", pos)
            if escape < 0 or 0 <= end < escape:
                return end
            state, pos = 1, escape + 2  # its "--" may be the "--" of "-->"
            continue
        unescape = ahead.find(b"-->", pos)
        inner = ahead.tag(b"<script", pos) if state == 1 else -1
        first = min((at for at in (end, unescape, inner) if at >= 0), default=-1)
        if first < 0:
            return -1
        if first == end:
            if state == 1:
                return end
            state, pos = 1, end + len(b"</script")
        elif first == unescape:
            state, pos = 0, unescape + 3
        else:
            state, pos = 2, inner + len(b"<script")


def scan(page: str | bytes) -> Scan:
    """``page`` read once (bytes as UTF-8)."""
    data = page if isinstance(page, bytes) else page.encode("utf-8", errors="surrogatepass")
    return _read(data)


def _decoded(text: str, limit: int) -> str:
    """``text`` (folded) with its character references decoded, folded again, at most
    ``limit`` characters: decoded only as far as needed, in rounds that double."""
    out: list[str] = []
    pos, want = 0, limit
    while True:
        pos = _decode_some(text, pos, out, want)
        result = fold("".join(out))
        if len(result) >= limit or pos >= len(text):
            return result[:limit]
        want *= 2


def _decode_some(text: str, pos: int, out: list[str], want: int) -> int:
    """Decode ``text`` from ``pos`` into ``out`` until ``want`` more characters are there
    or the text ends; where it stopped. Each reference gives at least one character."""
    got = 0
    while got < want:
        amp = text.find("&", pos)
        if amp < 0:
            out.append(text[pos:])
            return len(text)
        if amp > pos:
            out.append(text[pos:amp])
            got += amp - pos
        pos, value = _reference(text, amp)
        out.append(value)
        got += len(value)
    return pos


def _run_end(text: str, pos: int, chars: str) -> int:
    while True:
        chunk = text[pos : pos + 64]
        rest = chunk.lstrip(chars)
        if rest or len(chunk) < 64:
            return pos + len(chunk) - len(rest)
        pos += 64


def _reference(text: str, amp: int) -> tuple[int, str]:
    """The character reference at ``amp`` (an ``&``): where it ends and what it stands for
    (itself when it is none). html.unescape decodes each, on its few characters only: on a
    whole page it raises for a decimal reference of over 4,300 digits."""
    if text.startswith("#", amp + 1):
        start = amp + 2
        hexadecimal = text.startswith(("x", "X"), start)
        start += hexadecimal
        end = _run_end(text, start, _HEX_DIGITS if hexadecimal else _DIGITS)
        if end == start:
            return end, text[amp:end]
        digits = text[start:end].lstrip("0") or "0"
        code = int(digits, 16 if hexadecimal else 10) if len(digits) <= 8 else 0x110000
        return end + text.startswith(";", end), html.unescape(f"&#{code};")
    window = text[amp + 1 : amp + 33]
    length = len(window) - len(window.lstrip(_ALNUM))
    if not length:
        return amp + 1, "&"
    end = amp + 1 + length
    end += text.startswith(";", end)
    return end, html.unescape(text[amp:end])
