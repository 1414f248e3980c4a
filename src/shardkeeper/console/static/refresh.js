// shardkeeper console: live refresh of the page parts marked data-refresh, and
// confirmation of dangerous forms (data-confirm). No build step, no dependency.
// Every few seconds (body data-refresh-seconds; 0 = never) the page is fetched
// again and each element with data-refresh and an id is replaced by the element of
// the same id in the new page. Nothing is refreshed while the user is typing in a
// form, so an edit in progress is never lost, and an opened <details> (a
// traceback) stays open.
(function () {
  "use strict";

  function busy() {
    var el = document.activeElement;
    return !!el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA" || el.tagName === "SELECT");
  }

  function refresh() {
    if (document.hidden || busy()) {
      return Promise.resolve();
    }
    return fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (response) {
        if (!response.ok || response.redirected) {
          return null; // logged out or an error: keep what is shown
        }
        return response.text();
      })
      .then(function (html) {
        if (html === null || busy()) {
          return;
        }
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-refresh][id]").forEach(function (old) {
          var replacement = fresh.getElementById(old.id);
          if (replacement) {
            // a traceback the user opened stays open
            old.querySelectorAll("details[open][id]").forEach(function (shown) {
              var again = replacement.querySelector("#" + CSS.escape(shown.id));
              if (again) {
                again.open = true;
              }
            });
            old.replaceWith(document.importNode(replacement, true));
          }
        });
        document.body.setAttribute("data-refreshed", String(Date.now()));
      })
      .catch(function () { /* the server is away: try again next time */ });
  }

  function start() {
    document.addEventListener("submit", function (event) {
      var form = event.target;
      var question = form.getAttribute && form.getAttribute("data-confirm");
      if (question && !window.confirm(question)) {
        event.preventDefault();
      }
    });
    var seconds = parseFloat(document.body.getAttribute("data-refresh-seconds") || "0");
    if (!(seconds > 0) || !document.querySelector("[data-refresh][id]")) {
      return;
    }
    var tick = function () {
      refresh().then(function () { window.setTimeout(tick, seconds * 1000); });
    };
    window.setTimeout(tick, seconds * 1000);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
