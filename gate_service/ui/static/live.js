// A running gate's page updates itself: it asks for the page's live part with the ETag it
// holds (304 while nothing changed) and stops once the gate has ended. Without script the
// page still reads in full (and refreshes itself every 10 s through <noscript>).
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || live.dataset.live !== "true") return;
  var seconds = Number(live.dataset.pollSeconds) || 2;
  var url = window.location.pathname + "?fragment=1";
  function tick() {
    fetch(url, {
      headers: { "If-None-Match": live.dataset.etag },
      credentials: "same-origin",
      cache: "no-store",
    })
      .then(function (response) {
        if (response.status === 304) return null;
        if (response.redirected || response.status !== 200) {
          // Signed out or gone: a full load shows why.
          window.location.reload();
          return null;
        }
        live.dataset.etag = response.headers.get("ETag") || live.dataset.etag;
        return response.text();
      })
      .then(function (html) {
        if (html === null || html === undefined) return;
        var box = document.createElement("template");
        box.innerHTML = html;
        var focused = document.activeElement && document.activeElement.id;
        live.replaceChildren(box.content);
        if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
        var status = live.querySelector("[data-status]");
        var ended = status && ["passed", "failed", "error", "cancelled"].indexOf(status.dataset.status) >= 0;
        if (ended) {
          live.dataset.live = "false";
          document.title = document.title.replace(/\b(queued|running)\b/, status.dataset.status);
        }
      })
      .catch(function () { /* a dropped poll: try again at the next tick */ })
      .then(function () {
        if (live.dataset.live === "true") window.setTimeout(tick, seconds * 1000);
      });
  }
  window.setTimeout(tick, seconds * 1000);
})();
