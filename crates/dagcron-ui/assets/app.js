// dagcron's UI works without this script; it only tells the server the
// browser's time zone (so that times are shown in it) and, through htmx,
// keeps live parts of pages up to date.
(function () {
  try {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    var now = document.cookie.split("; ").find(function (c) { return c.indexOf("dagcron_tz=") === 0; });
    if (zone && now !== "dagcron_tz=" + encodeURIComponent(zone)) {
      document.cookie = "dagcron_tz=" + encodeURIComponent(zone) + "; Path=/; SameSite=Strict; Max-Age=31536000";
    }
  } catch (e) { /* an old browser: times stay in UTC */ }
  // A form that asks first (a cancel): sent only once confirmed. Without
  // this script it is sent at once, as any form.
  document.addEventListener("submit", function (ev) {
    var ask = ev.target.getAttribute ? ev.target.getAttribute("data-confirm") : null;
    if (ask && !window.confirm(ask)) { ev.preventDefault(); }
  });
  // A log followed live stays scrolled to its end.
  document.addEventListener("htmx:afterSwap", function (ev) {
    var pre = ev.detail.target.querySelector ? ev.detail.target.querySelector("pre.log") : null;
    if (pre) { pre.scrollTop = pre.scrollHeight; }
  });
})();
