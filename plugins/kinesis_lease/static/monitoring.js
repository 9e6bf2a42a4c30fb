// The monitoring page: reads the plugin's JSON API with the Airflow session cookie and renders it.
// Data only ever reaches the page as text (textContent, attributes), never as markup. Times are UTC.
"use strict";

(() => {
  const REFRESH_MILLIS = 15000;
  const PAGE_SIZE = 100;
  const SEARCH_DELAY_MILLIS = 250;
  const ROUNDS_IN_TABLE = 20; // the charts show them all
  const SHORT_SEQUENCE_EDGE = 6; // digits kept at each end of a shortened sequence number
  const BAD_OUTCOMES = new Set(["failed", "lost"]);
  const page = document.body.dataset;
  const byId = (id) => document.getElementById(id);

  // --- formatting -------------------------------------------------------------------------------

  const format = {
    number(value, digits = 0) {
      if (value === null || value === undefined) return "-";
      return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
    },
    bytes(value) {
      if (value === null || value === undefined) return "-";
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let size = Number(value);
      let unit = 0;
      while (Math.abs(size) >= 1024 && unit < units.length - 1) {
        size /= 1024;
        unit += 1;
      }
      return unit === 0 ? `${format.number(size)} B` : `${format.number(size, 1)} ${units[unit]}`;
    },
    millis(value) {
      if (value === null || value === undefined) return "-";
      if (Math.abs(value) < 1000) return `${format.number(value)} ms`;
      return format.seconds(value / 1000);
    },
    seconds(value) {
      if (value === null || value === undefined) return "-";
      if (Math.abs(value) < 120) return `${format.number(value, Math.abs(value) < 60 ? 1 : 0)} s`;
      if (Math.abs(value) < 7200) return `${format.number(value / 60, 1)} min`;
      return `${format.number(value / 3600, 1)} h`;
    },
    ratio(value) {
      return value === null || value === undefined ? "-" : `${Number(value).toFixed(2)}x`;
    },
    percent(share) {
      return `${Math.round(share * 100)}%`;
    },
    // "2026-11-24 13:40:05": every time on the page is UTC, and says so where it is shown.
    utc(millis) {
      return new Date(millis).toISOString().replace("T", " ").slice(0, 19);
    },
    utcLabelled(millis) {
      return millis ? `${format.utc(millis)} UTC` : "an unknown time";
    },
    roundLabel(round) {
      // An idle round assigned nothing, so it has no number of its own.
      const numbered = round.round === null || round.round === undefined ? "round" : `round ${round.round}`;
      const name = round.idle ? "idle round" : numbered;
      return `${name} · ${format.utc(round.finished_at).slice(0, 16)} UTC`;
    },
  };

  // --- the API -----------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(`${status}: ${detail}`);
      this.status = status;
    }
  }

  async function getJson(path) {
    const response = await fetch(page.base + path, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const detail = typeof body.detail === "string" ? body.detail : response.statusText;
      throw new ApiError(response.status, detail);
    }
    return body;
  }

  // --- small DOM helpers ---------------------------------------------------------------------------

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  function cell(text, title) {
    const td = element("td", text);
    if (title) td.title = title;
    return td;
  }

  function badge(state) {
    const known = ["success", "failed", "running", "queued"].includes(state);
    const node = element("span", state || "unknown", `badge ${known ? state : "unknown"}`);
    node.dataset.state = state || "unknown";
    return node;
  }

  function idleBadge() {
    const node = element("span", "idle", "badge idle");
    node.title = "Nothing to read: the round's consume step was skipped";
    return node;
  }

  function showEmpty(id, text) {
    const node = byId(id);
    node.hidden = text === null;
    node.textContent = text || "";
  }

  // --- light and dark mode: Airflow's own setting --------------------------------------------------

  const theme = {
    // The Airflow UI (next-themes) puts "light" or "dark" on its <html>; this page is in its iframe,
    // same origin. Opened on its own, the page reads the setting Airflow stores, then the system's.
    current() {
      const parent = theme.parentRoot();
      if (parent?.classList.contains("dark")) return "dark";
      if (parent?.classList.contains("light")) return "light";
      const stored = theme.stored();
      if (stored === "dark" || stored === "light") return stored;
      return window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
    },
    parentRoot() {
      try {
        return window.parent !== window ? window.parent.document.documentElement : null;
      } catch {
        return null; // another origin's page: its setting cannot be read
      }
    },
    stored() {
      try {
        return window.localStorage.getItem("theme");
      } catch {
        return null;
      }
    },
    apply() {
      const mode = theme.current();
      if (document.documentElement.dataset.theme === mode) return;
      document.documentElement.dataset.theme = mode;
      roundCharts.redraw();
    },
    follow() {
      theme.apply();
      const parent = theme.parentRoot();
      if (parent) new MutationObserver(theme.apply).observe(parent, { attributes: true, attributeFilter: ["class"] });
      window.addEventListener("storage", theme.apply);
      window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", theme.apply);
    },
  };

  function chartPalette() {
    const style = getComputedStyle(document.documentElement);
    const variable = (name) => style.getPropertyValue(name).trim();
    return {
      font: variable("--font-body"),
      axis: variable("--chart-axis"),
      grid: variable("--chart-grid"),
      idle: `color-mix(in oklch, ${variable("--gray-500")} 18%, transparent)`,
      colour: (name) => variable(`--${name}-500`),
      translucent: (colour) => `color-mix(in oklch, ${colour} 45%, transparent)`,
    };
  }

  // --- the state now ---------------------------------------------------------------------------------

  // What is true of the leader lock: a round running now, or which round held it last and when.
  function leaderText(leader, rounds) {
    const newest = rounds.find((round) => round.finished_at);
    if (leader === null || leader === undefined) {
      return newest ? `no round running; last round finished at ${format.utcLabelled(newest.finished_at)}` : "no round has run yet";
    }
    if (leader.running) {
      const heartbeat = leader.heartbeat_at ? `heartbeat at ${format.utcLabelled(leader.heartbeat_at)}` : "no heartbeat yet";
      return `round running: ${leader.owner} (${heartbeat})`;
    }
    // When this owner was last seen: its last heartbeat, or its round's finish once it released.
    const at = leader.seen_at ?? leader.heartbeat_at ?? newest?.finished_at;
    // Rounds of an older release did not keep their leader's name.
    if (!leader.owner) return at ? `no round running; last round finished at ${format.utcLabelled(at)}` : "no round running";
    return `no round running; last leader ${leader.owner}${at ? ` at ${format.utcLabelled(at)}` : ""}`;
  }

  function lastRoundNodes(round) {
    if (!round) return [element("span", "No round has finished yet.", "muted")];
    const label = round.round === null || round.round === undefined ? "Round" : `Round ${round.round}`;
    const nodes = [roundLink(round, label), " ", badge(round.state)];
    if (round.idle) nodes.push(" ", idleBadge());
    const figures = round.idle
      ? "nothing to read"
      : `${format.number(round.records)} records, ${format.bytes(round.bytes)}; max lag ${format.millis(round.max_millis_behind_latest)}`;
    nodes.push(element("br"), element("span", `finished ${format.utcLabelled(round.finished_at)} · ${figures}`, "muted"));
    const freshness = freshnessText(round);
    if (freshness) nodes.push(element("br"), element("span", freshness, "freshness"));
    return nodes;
  }

  // The round's freshness at its end (docs/metrics.md); rounds of an older release have none.
  function freshnessText(round) {
    const oldest = round.oldest_unlanded_age_millis;
    const newest = round.newest_landed_age_millis;
    if ((oldest === null || oldest === undefined) && (newest === null || newest === undefined)) return null;
    return `freshness: oldest record not landed ≤ ${format.millis(oldest)} old · newest landed ${format.millis(newest)} old`;
  }

  function leaseSummaryNodes(summary) {
    const nodes = [
      element("strong", format.number(summary.lease_count)),
      ` lease(s) · ${format.number(summary.in_handoff)} in handoff · ${format.number(summary.at_shard_end)} at SHARD_END · ` +
        `${format.number(summary.pending_checkpoints)} with a prepared checkpoint`,
    ];
    const corrupt = corruptItems(summary).length;
    if (corrupt) nodes.push(" · ", element("strong", `${corrupt} corrupt item(s)`, "outcome bad"));
    return nodes;
  }

  // The application's enhanced fan-out consumers (retrieval = fan_out), one per stream it registered one on.
  function renderStreamConsumers(consumers) {
    const line = byId("stream-consumers");
    line.hidden = consumers.length === 0;
    const nodes = ["Fan-out consumers: "];
    consumers.forEach((consumer, index) => {
      if (index) nodes.push(" · ");
      const created = consumer.created ? `, created ${consumer.created}` : "";
      nodes.push(`${consumer.stream_name}: ${consumer.consumer_name} ${consumer.status}${created} `);
      nodes.push(consumer.ours
        ? element("span", "(ours)")
        : element("strong", "(not this application's: never used nor deregistered)", "outcome bad"));
      if (consumer.consumer_arn) nodes.push(element("span", ` ${consumer.consumer_arn}`, "muted"));
    });
    line.replaceChildren(...nodes);
  }

  function corruptItems(summary) {
    // Older servers listed each corrupt item as one sentence.
    return (summary.corrupt_items || []).map((item) => (typeof item === "string"
      ? { lease_key: null, attribute: null, problem: item }
      : item));
  }

  function renderCorrupt(items) {
    byId("corrupt-section").hidden = items.length === 0;
    byId("corrupt-items").tBodies[0].replaceChildren(...items.map((item) => {
      const row = element("tr");
      row.dataset.leaseKey = item.lease_key ?? "";
      row.append(cell(item.lease_key ?? "-"), cell(item.attribute ?? "(the item)"), cell(item.problem));
      return row;
    }));
  }

  // --- workers -------------------------------------------------------------------------------------

  function cpuText(worker) {
    if (worker.unassigned) return "";
    // A slot that holds no lease read nothing: a CPU figure would be an older round's.
    if (worker.leases === 0) return " · no leases, no CPU figure";
    return worker.cpu_percent === null || worker.cpu_percent === undefined
      ? " · CPU -"
      : ` · CPU ${format.number(worker.cpu_percent)}%`;
  }

  function workerRow(worker) {
    const row = element("div", null, worker.unassigned ? "worker unassigned" : "worker");
    row.dataset.worker = worker.worker_id;
    row.dataset.load = String(worker.load);
    const name = element("span", worker.worker_id, "worker-name");
    name.title = worker.worker_id;
    const bar = element("div", null, "bar");
    bar.setAttribute("role", "img");
    bar.setAttribute("aria-label", `load ${format.percent(worker.load)} of the busiest worker`);
    const fill = element("div", null, "fill");
    fill.style.width = `${(worker.load * 100).toFixed(1)}%`;
    bar.append(fill);
    const figures = element(
      "span",
      `${worker.leases} lease(s) (${format.percent(worker.lease_share)}) · ` +
        `${format.number(worker.throughput_kbps, 1)} KB/s (${format.percent(worker.throughput_share)})${cpuText(worker)}`,
      "worker-figures",
    );
    row.append(name, bar, figures);
    return row;
  }

  function renderWorkers(workers) {
    byId("workers").replaceChildren(...workers.map(workerRow));
    showEmpty("workers-empty", workers.length ? null : "No workers: no lease has an owner and no slot has reported metrics yet.");
  }

  // --- rounds ----------------------------------------------------------------------------------------

  // A run's page in the Airflow UI: the API gives its path from the server's root (with Airflow's base path).
  function airflowUrl(path) {
    const url = new URL(path, window.location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  }

  function roundLink(round, text) {
    const href = round.run_url ? airflowUrl(round.run_url) : null;
    if (!href) {
      const span = element("span", text);
      if (round.run_id) span.title = `DAG run ${round.run_id}`;
      return span;
    }
    const link = element("a", text);
    link.href = href;
    link.target = "_top"; // the page is in the Airflow UI's iframe: open the run in the UI itself
    link.title = `DAG run ${round.run_id}${round.dag_id ? ` of ${round.dag_id}` : ""}`;
    link.addEventListener("click", (event) => openAtTop(event, href));
    return link;
  }

  // Airflow sandboxes its plugin iframes without allow-top-navigation, so target="_top" does nothing
  // there. The iframe is same-origin, though: the link is followed by an anchor of the Airflow page.
  function openAtTop(event, href) {
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
    let top;
    try {
      top = window.top !== window ? window.top.document : null;
    } catch {
      return; // another origin's page: let the browser follow the link as it can
    }
    if (!top) return;
    event.preventDefault();
    const anchor = top.createElement("a");
    anchor.href = href;
    anchor.hidden = true;
    top.body.append(anchor);
    anchor.click();
    anchor.remove();
  }

  function stateCell(round) {
    const td = element("td");
    td.append(badge(round.state));
    if (round.idle) td.append(" ", idleBadge());
    return td;
  }

  function roundRow(round) {
    const row = element("tr", null, round.idle ? "idle" : "");
    row.dataset.round = String(round.round ?? "");
    row.dataset.runId = round.run_id ?? "";
    const name = element("td");
    name.append(roundLink(round, round.round === null || round.round === undefined ? "-" : `#${round.round}`));
    const busy = (text) => (round.idle ? "idle" : text);
    row.append(
      name,
      stateCell(round),
      cell(round.finished_at ? format.utc(round.finished_at) : "-"),
      cell(busy(format.number(round.records))),
      cell(busy(format.bytes(round.bytes))),
      cell(busy(format.number(round.files))),
      cell(busy(format.seconds(round.seconds))),
      cell(busy(format.millis(round.max_millis_behind_latest))),
      // An idle round has a freshness too: its check found nothing the output lacks.
      cell(format.millis(round.oldest_unlanded_age_millis)),
      cell(busy(format.number(window.KinesisLeaseCharts.backlogOf(round)))),
      cell(format.number(round.lost_leases)),
      cell(format.number(round.failed_leases)),
      cell(format.number(round.retention_losses)),
      cell(format.number(round.dead_lettered)),
      cell(format.number(round.moves)),
      cell(busy(format.ratio(round.busiest_over_bound))),
    );
    return row;
  }

  let allRounds = false;

  function renderRounds(rounds) {
    const shown = allRounds ? rounds : rounds.slice(0, ROUNDS_IN_TABLE);
    byId("rounds").tBodies[0].replaceChildren(...shown.map(roundRow));
    const more = byId("rounds-more");
    more.hidden = rounds.length <= ROUNDS_IN_TABLE;
    more.textContent = allRounds ? `Show the last ${ROUNDS_IN_TABLE} rounds only` : `Show all ${rounds.length} rounds`;
    byId("rounds").closest(".table-frame").hidden = rounds.length === 0;
    showEmpty("rounds-empty", rounds.length ? null : "No rounds yet: the pipeline has not finished a round of this application.");
  }

  // --- the history charts: redrawn when the rounds or the colours change --------------------------------

  const roundCharts = {
    rounds: [],
    key: null,
    charts: null,
    show(rounds) {
      const key = JSON.stringify(rounds);
      if (key === roundCharts.key) return;
      roundCharts.key = key;
      roundCharts.rounds = rounds;
      roundCharts.redraw();
    },
    redraw() {
      const container = byId("charts");
      roundCharts.charts?.destroy();
      roundCharts.charts = null;
      container.replaceChildren();
      const rounds = roundCharts.rounds;
      const timed = rounds.filter((round) => round.finished_at);
      const idle = timed.filter((round) => round.idle).length;
      showEmpty("history-empty", timed.length ? null : "No history yet: charts appear once a round of this application has finished.");
      byId("history-caption").textContent = timed.length
        ? `The last ${timed.length} round(s), ${idle} idle (shaded: nothing to read); times in UTC. Hover a chart to read a round.`
        : "";
      if (!timed.length || byId("content").hidden) return;
      roundCharts.charts = window.KinesisLeaseCharts.render(container, rounds, chartPalette(), format);
    },
    resize() {
      roundCharts.charts?.resize();
    },
  };

  // --- the lease table: one page of the API's at a time -----------------------------------------------

  const leases = {
    application: null,
    query: { offset: 0, sort: "lease_key", order: "asc", owner: "", outcome: "", q: "" },
    requested: 0,
    async load() {
      if (!leases.application) return;
      const request = ++leases.requested;
      const params = new URLSearchParams({ ...leases.query, limit: String(PAGE_SIZE) });
      for (const name of ["owner", "outcome", "q"]) if (!params.get(name)) params.delete(name);
      const path = `/api/applications/${encodeURIComponent(leases.application)}/leases?${params}`;
      const body = await getJson(path);
      if (request === leases.requested) leases.render(body); // a newer request's answer wins
    },
    render(body) {
      fillOptions(byId("lease-owner"), body.owners || [], "All owners");
      fillOptions(byId("lease-outcome"), body.outcomes || [], "All outcomes");
      byId("leases").tBodies[0].replaceChildren(...body.leases.map(leaseRow));
      const shown = body.leases.length;
      byId("lease-range").textContent = shown
        ? `${format.number(body.offset + 1)}–${format.number(body.offset + shown)} of ${format.number(body.filtered)}` +
          (body.filtered === body.total ? "" : ` (filtered from ${format.number(body.total)})`)
        : "";
      byId("lease-previous").disabled = body.offset === 0;
      byId("lease-next").disabled = body.offset + shown >= body.filtered;
      byId("leases-frame").hidden = shown === 0;
      showEmpty("leases-empty", leasesEmptyText(body));
      markSort();
    },
    change(update) {
      Object.assign(leases.query, { offset: 0 }, update);
      leases.load().catch(showError);
    },
  };

  function leasesEmptyText(body) {
    if (body.leases.length) return null;
    if (body.total === 0) return "No leases: shard sync has not created any for this application yet (its first round does).";
    if (body.filtered === 0) return `No lease matches these filters (${format.number(body.total)} lease(s) in all).`;
    return "No leases on this page.";
  }

  function fillOptions(select, values, allLabel) {
    const chosen = select.value;
    const names = chosen && !values.includes(chosen) ? [...values, chosen] : values;
    const current = [...select.options].slice(1).map((option) => option.value);
    if (current.length === names.length && current.every((name, i) => name === names[i])) return; // an open list stays open
    const options = [new Option(allLabel, ""), ...names.map((name) => new Option(name, name))];
    select.replaceChildren(...options);
    select.value = chosen;
  }

  function shortSequence(value) {
    const digits = /^\d+$/.test(value.split("/")[0]);
    const keep = SHORT_SEQUENCE_EDGE;
    return digits && value.length > 2 * keep + 3 ? `${value.slice(0, keep)}…${value.slice(-keep)}` : value;
  }

  async function copyValue(button, value) {
    try {
      await navigator.clipboard.writeText(value);
      flash(button, "✓", "Copied", "copy copied");
    } catch {
      flash(button, "!", "Could not copy: select the value from the tooltip", "copy");
    }
  }

  function flash(button, text, label, className) {
    button.textContent = text;
    button.className = className;
    button.setAttribute("aria-label", label);
    window.setTimeout(() => {
      button.textContent = "⧉";
      button.className = "copy";
      button.setAttribute("aria-label", button.dataset.label);
    }, 1500);
  }

  // A sequence number shortened to its ends, whole in the tooltip and on the clipboard.
  function sequenceCell(value, what) {
    if (!value) return cell("-");
    const td = element("td");
    const wrapper = element("span", null, "sequence");
    const code = element("code", shortSequence(value));
    code.title = value;
    code.dataset.full = value;
    const copy = element("button", "⧉", "copy");
    copy.type = "button";
    copy.dataset.label = `Copy the full ${what}`;
    copy.setAttribute("aria-label", copy.dataset.label);
    copy.title = `Copy ${value}`;
    copy.addEventListener("click", () => copyValue(copy, value));
    wrapper.append(code, copy);
    td.append(wrapper);
    return td;
  }

  function lineageCell(lease) {
    const parents = lease.parent_shard_ids || [];
    const children = lease.child_shard_ids || [];
    const td = element("td", null, "lineage");
    if (!parents.length && !children.length) {
      td.textContent = "-";
      return td;
    }
    const details = element("details");
    const counts = [];
    if (parents.length) counts.push(`${parents.length} parent${parents.length > 1 ? "s" : ""}`);
    if (children.length) counts.push(`${children.length} child${children.length > 1 ? "ren" : ""}`);
    const list = element("ul");
    list.append(
      ...parents.map((id) => element("li", `parent ${id}`)),
      ...children.map((id) => element("li", `child ${id}`)),
    );
    details.append(element("summary", counts.join(", ")), list);
    td.append(details);
    return td;
  }

  function outcomeCell(last) {
    if (!last) return cell("-", "Not read in the last round");
    if (last.outcome === "(not read)") return cell(last.outcome, "Not read in the last round: its freshness is carried from the round that last read it");
    if (!last.worker_id) return cell(last.outcome ?? "-", "The last round's row of this lease was not kept (too many leases)");
    const td = cell(null, `Read by ${last.worker_id ?? "-"} in the last round`);
    td.append(element("span", last.outcome ?? "-", BAD_OUTCOMES.has(last.outcome) ? "outcome bad" : "outcome"));
    // What stopped a failed or lost lease, under its outcome: the same error every round is a record
    // its processing cannot handle.
    if (last.error) td.append(element("div", last.error, "lease-error"));
    // Records its decoder rejected, set aside rather than landed: worth a look, though the lease went on.
    if (last.dead_lettered) td.append(element("div", `${format.number(last.dead_lettered)} dead-lettered`, "lease-note"));
    return td;
  }

  function numberCell(text) {
    const td = cell(text);
    td.className = "number";
    return td;
  }

  function leaseRow(lease) {
    const row = element("tr");
    row.dataset.leaseKey = lease.lease_key;
    const owner = lease.checkpoint_owner ? `${lease.checkpoint_owner} → ${lease.owner}` : lease.owner || "unassigned";
    const last = lease.last_round;
    row.append(
      cell(lease.lease_key, lease.lease_key),
      cell(owner, lease.checkpoint_owner ? `in graceful handoff: ${owner}` : owner),
      sequenceCell(lease.checkpoint, "checkpoint"),
      sequenceCell(lease.pending_checkpoint, "pending checkpoint"),
      outcomeCell(last),
      numberCell(last ? format.number(last.records) : "-"),
      numberCell(last ? format.millis(last.millis_behind_latest) : "-"),
      numberCell(last ? format.millis(last.oldest_unlanded_age_millis) : "-"),
      numberCell(format.number(lease.throughput_kbps, 1)),
      lineageCell(lease),
      numberCell(String(lease.lease_counter)),
    );
    return row;
  }

  function markSort() {
    for (const th of byId("leases").tHead.querySelectorAll("th[data-sort]")) {
      if (th.dataset.sort === leases.query.sort) {
        th.setAttribute("aria-sort", leases.query.order === "asc" ? "ascending" : "descending");
      } else {
        th.removeAttribute("aria-sort");
      }
    }
  }

  // Sortable headers: a button in each, so the keyboard sorts too; big numbers first on the first click.
  function sortableHeaders() {
    const descendingFirst = new Set(["throughput_kbps", "lag", "freshness", "records", "lease_counter"]);
    for (const th of byId("leases").tHead.querySelectorAll("th[data-sort]")) {
      const button = element("button", th.textContent);
      button.type = "button";
      th.replaceChildren(button);
      button.addEventListener("click", () => {
        const key = th.dataset.sort;
        const same = leases.query.sort === key;
        const first = descendingFirst.has(key) ? "desc" : "asc";
        const order = same ? (leases.query.order === "asc" ? "desc" : "asc") : first;
        leases.change({ sort: key, order });
      });
    }
  }

  function leaseControls() {
    sortableHeaders();
    byId("lease-owner").addEventListener("change", (event) => leases.change({ owner: event.target.value }));
    byId("lease-outcome").addEventListener("change", (event) => leases.change({ outcome: event.target.value }));
    let timer = null;
    byId("lease-search").addEventListener("input", (event) => {
      window.clearTimeout(timer);
      timer = window.setTimeout(() => leases.change({ q: event.target.value.trim() }), SEARCH_DELAY_MILLIS);
    });
    byId("lease-filters").addEventListener("submit", (event) => {
      event.preventDefault();
      window.clearTimeout(timer);
      leases.change({ q: byId("lease-search").value.trim() });
    });
    const step = (direction) => {
      leases.query.offset = Math.max(0, leases.query.offset + direction * PAGE_SIZE);
      leases.load().catch(showError);
    };
    byId("lease-previous").addEventListener("click", () => step(-1));
    byId("lease-next").addEventListener("click", () => step(1));
  }

  // --- the page -------------------------------------------------------------------------------------

  // The tables, and where worker metrics and coordinator state live: the lease table itself in KCL 3.5's single layout.
  function tablesText(tables, layout) {
    const migration = layout.table_migration ? `; table migration: ${layout.table_migration}` : "";
    if (layout.layout === "conflict") {
      // Both layouts at once: rounds refuse to run until an operator deletes one layout's tables.
      return `Tables: LAYOUT CONFLICT, rounds refuse to run: ${layout.reason}`;
    }
    if (layout.layout === "single") {
      return `Tables: ${tables.lease} (leases, worker metrics and coordinator state: single-table layout${migration})`;
    }
    return (
      `Tables: ${tables.lease} (leases), ${tables.worker_metrics} (worker metrics), ` +
      `${tables.coordinator_state} (coordinator state)${migration}`
    );
  }

  function renderOverview(overview) {
    byId("application-name").textContent = overview.application;
    byId("tables").textContent = tablesText(overview.tables, overview.table_layout || {});
    const rounds = overview.rounds || [];
    byId("leader").textContent = leaderText(overview.leader, rounds);
    byId("last-round").replaceChildren(...lastRoundNodes(rounds[0]));
    byId("lease-summary").replaceChildren(...leaseSummaryNodes(overview.summary));
    renderStreamConsumers(overview.stream_consumers || []);
    renderCorrupt(corruptItems(overview.summary));
    renderWorkers(overview.workers || []);
    renderRounds(rounds);
    byId("content").hidden = false;
    roundCharts.show(rounds);
  }

  // One figure of the run's round: a term and its value, grouped (a <div> in the <dl>) so that they wrap together.
  function figure(term, value) {
    return [wrap("div", element("dt", term), value instanceof Node ? wrap("dd", value) : element("dd", value))];
  }

  function wrap(tag, ...children) {
    const node = element(tag);
    node.append(...children);
    return node;
  }

  function renderRunRound(round) {
    byId("run-round-section").hidden = false;
    const target = byId("run-round");
    if (round === null || round === undefined) {
      target.replaceChildren(element("p", "No figures yet: the run has not finished its round.", "empty"));
      return;
    }
    const list = element("dl", null, "figures");
    const busy = (text) => (round.idle ? "idle" : text);
    const state = wrap("span", badge(round.state), ...(round.idle ? [" ", idleBadge()] : []));
    list.append(
      ...figure("round", roundLink(round, round.round === null || round.round === undefined ? "-" : `#${round.round}`)),
      ...figure("state", state),
      ...figure("finished", round.finished_at ? format.utcLabelled(round.finished_at) : "-"),
      ...figure("records", busy(format.number(round.records))),
      ...figure("bytes", busy(format.bytes(round.bytes))),
      ...figure("files", busy(format.number(round.files))),
      ...figure("duration", format.seconds(round.seconds)),
      ...figure("max lag", busy(format.millis(round.max_millis_behind_latest))),
      ...figure("oldest not landed", format.millis(round.oldest_unlanded_age_millis)),
      ...figure("newest landed", format.millis(round.newest_landed_age_millis)),
      ...figure("lost leases", format.number(round.lost_leases)),
      ...figure("failed leases", format.number(round.failed_leases)),
      ...figure("retention losses", format.number(round.retention_losses)),
      ...figure("dead-lettered", format.number(round.dead_lettered)),
      ...figure("busiest slot / bound", busy(format.ratio(round.busiest_over_bound))),
      // A table sink's round: the snapshot its one commit made (text: a 64-bit id).
      ...(round.snapshot_id ? figure("table snapshot", round.snapshot_id) : []),
      // Where the round landed: the dataset or the table (`iceberg://catalog/namespace.table`).
      ...(round.output ? figure("output", round.output) : []),
      // A round whose consume step failed: what stopped it, and its failed leases' errors.
      ...(round.error ? figure("error", element("span", round.error, "outcome bad")) : []),
      ...((round.failures || []).length
        ? figure("failed leases", wrap("ul", ...round.failures.map((failure) => element("li", failure, "lease-error"))))
        : []),
    );
    target.replaceChildren(list);
  }

  function showMessage(text) {
    byId("message").textContent = text;
  }

  function showError(error) {
    byId("content").hidden = true;
    roundCharts.key = null; // drawn again once the content shows
    const hint = error.status === 401 ? " Log in to Airflow again." : "";
    showMessage(`Could not load the leases: ${error.message}.${hint}`);
  }

  async function applicationName() {
    const requested = new URLSearchParams(window.location.search).get("application");
    if (requested) return requested;
    return (await getJson("/api/default-application")).application;
  }

  // The deployment's pipelines, to switch between (a select, when there are any); read once per page.
  let pipelinesShown = false;
  async function showPipelines(application) {
    if (pipelinesShown) return;
    pipelinesShown = true;
    const { pipelines } = await getJson("/api/applications");
    const select = byId("application-select");
    const known = pipelines.some((pipeline) => pipeline.application === application);
    const options = pipelines.map((pipeline) => {
      const option = element("option", `${pipeline.application} (${pipeline.dag_id})`);
      option.value = pipeline.application;
      return option;
    });
    if (!known && application) options.unshift(Object.assign(element("option", application), { value: application }));
    select.replaceChildren(...options);
    select.value = application ?? "";
    select.hidden = pipelines.length === 0;
  }

  async function loadApplication(fresh) {
    byId("application-form").hidden = false;
    const application = await applicationName();
    await showPipelines(application);
    if (!application) {
      showMessage("Enter the name of a KCL application (its lease table).");
      return false;
    }
    byId("application-input").value = application;
    leases.application = application;
    // The overview reads the tables afresh; the page of leases comes from those same reads, kept a few seconds.
    const overview = await getJson(`/api/applications/${encodeURIComponent(application)}?fresh=${fresh ? 1 : 0}`);
    await leases.load();
    renderOverview(overview);
    return true;
  }

  async function loadDagRun(fresh) {
    const path = `/api/dag-runs/${encodeURIComponent(page.dagId)}/${encodeURIComponent(page.runId)}?fresh=${fresh ? 1 : 0}`;
    const run = await getJson(path);
    const heading = byId("run-heading");
    heading.hidden = false;
    heading.textContent = `DAG run ${run.run_id} of ${run.dag_id}`;
    leases.application = run.application ?? run.overview.application;
    await leases.load();
    renderRunRound(run.round);
    renderOverview(run.overview);
    return true;
  }

  let loading = false;
  let loadsFinished = 0; // on the body as data-loads: a reader (a test, a script) can wait for a load to end

  // A refresh the user asks for reads the tables anew; the timer's may share reads another tab
  // made a few seconds before (each read scans the whole lease table), and skips hidden pages.
  async function load(fresh = true) {
    if (loading) return;
    loading = true;
    try {
      const loaded = await (page.view === "dag-run" ? loadDagRun(fresh) : loadApplication(fresh));
      if (loaded) {
        showMessage("");
        byId("updated").textContent = `Updated ${format.utc(Date.now()).slice(11)} UTC`;
      }
    } catch (error) {
      showError(error);
    } finally {
      loading = false;
      document.body.dataset.loads = String(++loadsFinished);
    }
  }

  byId("application-select").addEventListener("change", (event) => {
    const search = new URLSearchParams({ application: event.target.value });
    window.location.search = search.toString();
  });
  byId("application-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const search = new URLSearchParams({ application: byId("application-input").value.trim() });
    window.location.search = search.toString();
  });
  byId("refresh").addEventListener("click", () => load(true));
  byId("rounds-more").addEventListener("click", () => {
    allRounds = !allRounds;
    renderRounds(roundCharts.rounds);
  });
  leaseControls();
  theme.follow();
  new ResizeObserver(() => roundCharts.resize()).observe(byId("charts"));
  window.setInterval(() => {
    if (!document.hidden) load(false);
  }, REFRESH_MILLIS);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) load(false);
  });
  load(true);
})();
