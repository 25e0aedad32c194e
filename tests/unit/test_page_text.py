"""A fetched page's text (web_read_page): what it says, and that it takes linear time.

Two readers answer it: the gateway's (gate_service/page_reader.py: libxml2 through lxml,
behind a linear scan, in reader processes of its own, gateway/pages.py) and the runner's
own (gate_runner/html_text.py: the scan alone, for a case that fetches a page itself). A
page is up to MAX_PAGE_BYTES of a server's choosing, so each reads 2 MiB of every known
worst case, for HTML parsers and for the regular expression this replaced (``"<" * 250_000``
took 35 s through it), within a bound: BOUND_S of CPU, or RATIO times an ordinary 2 MiB page
read in the same test where this machine is slower than that. A quadratic reader takes
minutes on any of them; a call still running after STOP_S is interrupted where it can be.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from gate_runner import html_text
from gate_runner.gateway_wire import MAX_PAGE_CHARS
from gate_runner.predefined import page_text as runner_page_text
from gate_service import page_reader
from gate_service.gateway import pages
from tests.fixtures.hostile_pages import ORDINARY, WORST, N, attributes
from tests.fixtures.pages import PAGE

BOUND_S = 2.0
RATIO = 4.0
STOP_S = 60.0


def _runner(page: str | bytes) -> str:
    """The runner's direct fetch reads httpx's ``response.text``: a page decoded."""
    if isinstance(page, bytes):
        page = page.decode("utf-8", errors="replace")
    return runner_page_text(page)


READERS: dict[str, Callable[[str | bytes], str]] = {
    "gateway": pages.page_text,  # in the gateway's reader process
    "runner": _runner,
}


def _gateway_here(page: str | bytes) -> str:
    """What the gateway's reader process runs, run in this thread (whose CPU is timed)."""
    if isinstance(page, str):
        page = page.encode()
    return page_reader.read(page.decode("utf-8", errors="replace").encode())


TIMED: dict[str, Callable[[str | bytes], str]] = {"gateway": _gateway_here, "runner": _runner}


class _TooSlow(Exception):
    pass


def _stop(signum: int, frame: Any) -> None:
    raise _TooSlow


def _cpu(read: Callable[[str | bytes], str], page: bytes) -> float:
    """The CPU ``read(page)`` took in this thread (libxml2's too: it runs in the thread that
    calls it, without the GIL). Interrupted at STOP_S of wall time once back in Python."""
    previous = signal.signal(signal.SIGALRM, _stop)
    signal.setitimer(signal.ITIMER_REAL, STOP_S)
    started = time.thread_time()
    try:
        read(page)
    except _TooSlow:
        return STOP_S
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.thread_time() - started


@pytest.fixture(scope="module")
def ordinary_cpu() -> dict[str, float]:
    return {name: _cpu(read, ORDINARY.encode()) for name, read in TIMED.items()}


@pytest.mark.slow
@pytest.mark.parametrize("reader", TIMED)
@pytest.mark.parametrize("case", WORST)
def test_each_worst_case_of_2_mib_is_read_in_linear_time(
    reader: str, case: str, ordinary_cpu: dict[str, float]
) -> None:
    page = WORST[case].encode()
    assert len(page) <= N + 64
    took = _cpu(TIMED[reader], page)
    bound = max(BOUND_S, RATIO * ordinary_cpu[reader])
    assert took <= bound, (
        f"{reader} read {case} ({len(page)} bytes) in {took:.2f} s of CPU; an ordinary "
        f"page of that size in {ordinary_cpu[reader]:.2f} s; the bound is {bound:.2f} s"
    )


def test_a_tag_of_many_distinct_attributes_is_never_given_to_libxml2() -> None:
    """The shape that makes libxml2 quadratic (each attribute appended after a walk of the
    ones before): 200 KB of it already takes libxml2 seconds; the scan sees it first."""
    page = attributes(200_000, lambda i: f"a{i:x}").encode()
    assert html_text.scan(page).widest > page_reader.MAX_ATTRIBUTES
    assert _cpu(_gateway_here, page) < BOUND_S
    assert pages.page_text(page) == "x"


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    ("page", "text"),
    [
        (PAGE, "Prices Tea costs 3 coins."),
        ("<p>co<b>in</b>s <a href=x>here</a>.</p><p>next</p>", "coins here. next"),
        ("a<br>b<hr>c<div>d</div>e<li>f", "a b c d e f"),
        (
            "<head><title>T</title><style>p{}</style><script>var a = 1 < 2;</script></head>"
            "<body>a<script>x()</script>b<noscript>no <b>js</b></noscript>c"
            "<template><p>t</p></template>d<iframe>f</iframe>e</body>",
            "T abcde",
        ),
        ("<script>x</scripts>y</script>z", "z"),  # only its own end tag ends a script
        ("<script><!--<script></script>x-->y</script>z", "z"),  # escaped twice
        ("<script/>x<style/>y<title/>z", "xy z"),  # libxml2 ends a raw text "<.../>"
        ("<script a=1/>x</script>z", "z"),  # "1/" is the value: not an empty tag
        ("<title>a &amp; b <i>c</i></title>", "a & b <i>c</i>"),  # title is text
        ("<textarea>x<b>y</b></textarea>", "x<b>y</b>"),
        ("<xmp><b>y</b>&amp;</xmp>", "<b>y</b>&amp;"),  # xmp's text has no references
        ("<plaintext><b>y</b></plaintext>", "<b>y</b></plaintext>"),
        ("a<!-- b -->c<!-->d<!--->e<!-- f --!>g<!---->h", "acdegh"),
        ("a<!DOCTYPE html>b<?php x ?>c<![CDATA[x]]>d</ x>e</>f", "abcdef"),
        ("<a title='1 > 2' href=\"x>y\">link</a>", "link"),
        ('<a ="x>y">z', 'y">z'),  # a name that starts with "=" is no quoted value
        ("<a b=c ='x>y'>z", "y'>z"),
        ("x &lt;p&gt; &amp;&amp; &quot;q&quot; &#65;&#x42;&#X43; &copy; &notit; &amp", None),
        ("&#0000000000000000000065; &#" + "9" * 5000 + "; &#x110000; &#0; &#;", None),
        ("a\t\n\r\f b\u00a0c&nbsp;&nbsp;d  ", "a b c d"),
        ("x<", "x<"),
        ("x</", "x</"),
        ("x<3 and y< z", "x<3 and y< z"),
        ("x<a href='", "x"),  # a tag the page's end cuts is dropped
        ("x<!-- no end", "x"),
        ("", ""),
        ("  <!-- -->  ", ""),
        ("<div>" * 300 + "deep" + "</div>" * 300 + "<p>after", "deep after"),
        (b"<p>caf\xc3\xa9 \xff</p>", "caf\u00e9 \ufffd"),
    ],
)
def test_the_text_is_the_page_s_words_without_markup(
    reader: str, page: str | bytes, text: str | None
) -> None:
    got = READERS[reader](page)
    if text is None:  # character references
        text = {
            "x": 'x <p> && "q" ABC \u00a9 \u00acit; &',
            "&": "A \ufffd \ufffd \ufffd &#;",
        }[str(page)[0]]
    assert got == text


@pytest.mark.parametrize("reader", READERS)
def test_the_text_is_cut_at_100_000_characters(reader: str) -> None:
    page = "<p>" + "word " * 100_000 + "</p>"
    got = READERS[reader](page)
    assert len(got) == MAX_PAGE_CHARS
    assert got.startswith("word word ")
    # ...and references are decoded only as far as the text is kept.
    got = READERS[reader]("&amp;" * (N // 5))
    assert got == "&" * MAX_PAGE_CHARS


def test_both_readers_agree_on_a_page_like_the_web_s() -> None:
    page = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
    <title>Tea &amp; Coffee</title><link rel="stylesheet" href="s.css">
    <script>window.x = "<b>not text</b>";</script><style>body { color: red }</style></head>
    <body class="page"><nav><ul><li><a href="/">Home</a></li><li><a href="/tea">Tea</a></li>
    </ul></nav><main><h1 id="t">Prices</h1><p>Tea costs <b>3</b>&nbsp;coins, <em>coffee</em>
    costs <span class="n">4</span>.</p><table><tr><th>Item</th><td>Tea</td></tr></table>
    <img src="x.png" alt="a > b"><form><input name="q" value="x"><button>Go</button></form>
    <noscript>Turn on JavaScript</noscript></main><footer>&copy; 2026</footer></body></html>"""
    expected = (
        "Tea & Coffee Home Tea Prices Tea costs 3 coins, coffee costs 4. Item Tea Go \u00a9 2026"
    )
    assert pages.page_text(page) == expected
    assert runner_page_text(page) == expected


# Pages made of the pieces that decide where tags, attributes, values, comments and raw
# text begin and end: the scan must never see fewer attributes on a tag than libxml2 gives
# an element, or a page could reach libxml2's quadratic attribute list unseen.
_PIECES = st.sampled_from(
    [
        "<", ">", "/", "=", '"', "'", " ", "\n", "a", "b", "x", "-", "!", "?", "<a", "</a",
        "<b ", "<!--", "-->", "--!>", "<script>", "</script>", "<style>", "</style", "<title>",
        "</title>", "<textarea>", "<noscript>", "</noscript>", "<template>", "<xmp>", "</xmp>",
        "<plaintext>", "<![CDATA[", "]]>", "<!DOCTYPE ", "&amp;", "<svg>", "<div>",
    ]
)  # fmt: skip


def _most_attributes(page: str) -> int:
    root = etree.fromstring(page.encode(), page_reader._reader.parser)
    if root is None:
        return 0
    return max(len(element.attrib) for element in root.iter())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_PIECES, max_size=80).map("".join))
def test_the_scan_counts_at_least_the_attributes_libxml2_builds(page: str) -> None:
    try:
        built = _most_attributes(page)
    except etree.LxmlError:
        return
    assert html_text.scan(page).widest >= built, page


def test_pages_are_read_in_processes_below_the_worker_s_priority() -> None:
    """The worker's GIL and CPU are the other projects' too: a page is read elsewhere."""
    assert pages.page_text(PAGE) == "Prices Tea costs 3 coins."
    readers = list(pages._readers()._processes.values())
    assert 1 <= len(readers) <= pages.READERS
    for reader in readers:
        assert os.getpriority(os.PRIO_PROCESS, reader.pid or 0) >= page_reader.NICENESS
    # A reader that dies is replaced; the page it held is read again.
    for reader in readers:
        reader.kill()
        reader.join()
    assert pages.page_text(PAGE) == "Prices Tea costs 3 coins."
