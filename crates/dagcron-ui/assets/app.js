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
  // A log followed live stays scrolled to its end.
  document.addEventListener("htmx:afterSwap", function (ev) {
    var pre = ev.detail.target.querySelector ? ev.detail.target.querySelector("pre.log") : null;
    if (pre) { pre.scrollTop = pre.scrollHeight; }
  });
})();
