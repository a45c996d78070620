// tuneharness web: refresh the live fields (data-live, data-job) from /api/live.json every 2 s.
// Shipped in the package; no library, no network beyond this server.
"use strict";
(function () {
  const PERIOD_MS = 2000;

  function fmtSeconds(v) {
    if (v === null || v === undefined) return "-";
    if (v < 120) return Math.round(v) + "s";
    if (v < 7200) return (v / 60).toFixed(1) + "m";
    return (v / 3600).toFixed(1) + "h";
  }

  function fmtLoss(v) {
    let s = Number(v).toPrecision(4); // the server's "{:.4g}", trailing zeros dropped
    if (s.indexOf("e") < 0 && s.indexOf(".") >= 0) s = s.replace(/0+$/, "").replace(/\.$/, "");
    return s;
  }

  function text(field, job) {
    const v = job[field];
    if (field === "eta_s") return fmtSeconds(v);
    if (field === "spent_usd") return "$" + Number(v).toFixed(4);
    if (field === "usd_per_hour") return Number(v).toFixed(3);
    if (field === "loss") return v === null ? "-" : fmtLoss(v);
    if (v === null || v === undefined) return "-";
    return String(v);
  }

  function apply(data) {
    document.querySelectorAll("[data-live][data-job]").forEach(function (el) {
      const job = data.jobs[el.dataset.job];
      if (!job || !(el.dataset.live in job)) return;
      const t = text(el.dataset.live, job);
      if (el.textContent !== t) el.textContent = t;
    });
    document.body.dataset.liveAt = String(data.now);
  }

  function poll() {
    fetch("/api/live.json", { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) apply(data); })
      .catch(function () { /* the server restarts: the next poll tries again */ })
      .finally(function () { window.setTimeout(poll, PERIOD_MS); });
  }

  window.setTimeout(poll, PERIOD_MS);
})();
