"""libxml2's reading of a fetched page into web_read_page's text, kept linear.

This runs in the gateway's page reader processes (gateway/pages.py), which import this
module and what it imports alone: lxml and the runner's scan. lxml parses the page (libxml2
2.14, whose tokenizer follows HTML's) and one XSLT pass writes the tree's text, both in time
linear in the page, with two exceptions, each measured and each kept off:

- libxml2 adds a tag's attributes to the element one by one, each after a walk of those
  already there: k attributes on one tag cost k² (2 MiB of distinct names: minutes). So the
  page is scanned first (gate_runner/html_text.py: linear, reading tags as HTML's tokenizer
  does, script escapes and libxml2's "/>" on raw text elements included), and a page with a
  tag of more than MAX_ATTRIBUTES attributes is answered with the scan's text.
- libxml2 nests at most 256 elements and drops the rest of the page (which keeps its
  searches of the open elements bounded: deeper pages are cut, not slow). A tree that
  reaches that depth is answered with the scan's text too.

The text: tags dropped, the content of script, style, noscript, template, iframe, noembed
and noframes dropped, phrasing elements (b, a, span, ...) joined to their neighbours and
every other element separating words, character references decoded, white space folded, at
most MAX_PAGE_CHARS characters: the scan's text says the same, so which one answers a page
is not seen (of 415 files named *.htm* on a development machine, the two read all 411 HTML
ones identically; the other 4, gzip data, differ by a character).

Selectolax (lexbor) and html5ever were measured and left: lexbor takes quadratic time in
the nesting depth (200 KB of ``<div>``: 4.3 s), in a tag's attributes and in active
formatting elements, and html5ever in the depth, neither with a cap.
"""

from __future__ import annotations

import os
import threading

from lxml import etree

from gate_runner.gateway_wire import MAX_PAGE_CHARS
from gate_runner.html_text import HIDDEN, PHRASING, fold, scan

# The most attributes a tag of a page libxml2 builds may have: its cost is the sum of their
# squares, so at most MAX_ATTRIBUTES times the page's attributes.
MAX_ATTRIBUTES = 128
# libxml2 stops at this many open elements (and drops the rest of the page).
MAX_DEPTH = 256
# A reader process yields the CPU to everything else the worker runs (cases, the worker).
NICENESS = 10

_TO_TEXT = f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:output method="text" encoding="UTF-8"/>
  <xsl:template match="{"|".join(sorted(HIDDEN))}"/>
  <xsl:template match="{"|".join(sorted(PHRASING))}"><xsl:apply-templates/></xsl:template>
  <xsl:template match="*">
    <xsl:text> </xsl:text><xsl:apply-templates/><xsl:text> </xsl:text>
  </xsl:template>
</xsl:stylesheet>"""


class _Reader(threading.local):
    """A parser, a stylesheet and a depth test per thread (a parser reads one page at a
    time: it holds a lock while it parses)."""

    def __init__(self) -> None:
        self.parser = etree.HTMLParser(
            encoding="utf-8",
            remove_comments=True,
            remove_pis=True,
            no_network=True,
            default_doctype=False,
            collect_ids=False,
        )
        self.to_text = etree.XSLT(etree.XML(_TO_TEXT))
        self.at_the_limit = etree.XPath("boolean(" + "/*" * MAX_DEPTH + ")")


_reader = _Reader()


def start() -> None:
    """A reader process's start: a lower priority than the worker's."""
    os.nice(NICENESS)


def read(data: bytes) -> str:
    """The text of ``data``, a page as valid UTF-8."""
    scanned = scan(data)
    if scanned.widest > MAX_ATTRIBUTES:
        return scanned.text()
    try:
        root = etree.fromstring(data, _reader.parser)
    except (etree.LxmlError, ValueError):
        root = None  # an empty document, say: the scan says what text it has
    if root is None or _reader.at_the_limit(root):
        return scanned.text()
    return fold(str(_reader.to_text(root)))[:MAX_PAGE_CHARS]
