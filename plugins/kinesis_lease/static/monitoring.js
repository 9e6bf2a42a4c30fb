// The monitoring page: reads the plugin's JSON API with the Airflow session cookie and renders it.
// Data only ever reaches the page as text (textContent), never as markup.
"use strict";

(() => {
  const REFRESH_MILLIS = 15000;
  const page = document.body.dataset;
  const byId = (id) => document.getElementById(id);

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

  function cell(text) {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }

  function number(value, digits = 0) {
    if (value === null || value === undefined) return "-";
    return Number(value).toLocaleString("en-US", { maximumFractionDigits: digits, minimumFractionDigits: digits });
  }

  function percent(share) {
    return `${Math.round(share * 100)}%`;
  }

  function fillRows(tableId, rows) {
    const body = byId(tableId).tBodies[0];
    body.replaceChildren(...rows);
  }

  function leaderText(leader) {
    if (leader === null) return "none (no round has taken the lock)";
    const seconds = Math.round(leader.lease_duration_millis / 1000);
    return leader.released ? `released by ${leader.owner}` : `${leader.owner} (lock lease ${seconds} s)`;
  }

  function workerRow(worker) {
    const row = document.createElement("div");
    row.className = worker.unassigned ? "worker unassigned" : "worker";
    row.dataset.worker = worker.worker_id;
    row.dataset.load = String(worker.load);
    const name = document.createElement("span");
    name.className = "worker-name";
    name.textContent = worker.worker_id;
    const bar = document.createElement("div");
    bar.className = "bar";
    const fill = document.createElement("div");
    fill.className = "fill";
    fill.style.width = `${(worker.load * 100).toFixed(1)}%`;
    bar.append(fill);
    const figures = document.createElement("span");
    figures.className = "worker-figures";
    const cpu = worker.cpu_percent === null ? "CPU -" : `CPU ${number(worker.cpu_percent)}%`;
    figures.textContent =
      `${worker.leases} lease(s) (${percent(worker.lease_share)}) · ` +
      `${number(worker.throughput_kbps, 1)} KB/s (${percent(worker.throughput_share)}) · ${cpu}`;
    row.append(name, bar, figures);
    return row;
  }

  function leaseRow(lease) {
    const row = document.createElement("tr");
    row.dataset.leaseKey = lease.lease_key;
    const owner = lease.checkpoint_owner ? `${lease.checkpoint_owner} → ${lease.owner}` : lease.owner || "-";
    const last = lease.last_round;
    row.append(
      cell(lease.lease_key),
      cell(owner),
      cell(lease.checkpoint),
      cell(lease.pending_checkpoint || "-"),
      cell(last ? number(last.millis_behind_latest) : "-"),
      cell(number(lease.throughput_kbps, 1)),
      cell(last ? `${last.outcome} · ${number(last.records)} record(s)` : "-"),
      cell(lease.parent_shard_ids.join(", ") || "-"),
      cell(lease.child_shard_ids.join(", ") || "-"),
      cell(String(lease.lease_counter)),
    );
    return row;
  }

  function balance(ratio) {
    return ratio === null || ratio === undefined ? "-" : `${ratio.toFixed(2)}x`;
  }

  function finishedAt(millis) {
    return millis ? new Date(millis).toISOString().replace("T", " ").slice(0, 19) : "-";
  }

  function roundRow(round) {
    const row = document.createElement("tr");
    row.dataset.round = String(round.round);
    row.append(
      cell(String(round.round ?? "-")),
      cell(finishedAt(round.finished_at)),
      cell(number(round.records)),
      cell(number(round.bytes)),
      cell(number(round.files)),
      cell(number(round.seconds, 1)),
      cell(number(round.max_millis_behind_latest)),
      cell(number(round.lost_leases)),
      cell(number(round.failed_leases)),
      cell(number(round.retention_losses)),
      cell(number(round.moves)),
      cell(balance(round.busiest_over_bound)),
    );
    return row;
  }

  function renderCorrupt(problems) {
    byId("corrupt-section").hidden = problems.length === 0;
    byId("corrupt-items").replaceChildren(...problems.map((problem) => {
      const item = document.createElement("li");
      item.textContent = problem;
      return item;
    }));
  }

  function renderOverview(overview) {
    byId("application-name").textContent = overview.application;
    const tables = overview.tables;
    byId("tables").textContent =
      `Tables: ${tables.lease}, ${tables.worker_metrics}, ${tables.coordinator_state}`;
    byId("leader").textContent = leaderText(overview.leader);
    byId("workers").replaceChildren(...overview.workers.map(workerRow));
    const summary = overview.summary;
    const corrupt = summary.corrupt_items.length ? `, ${summary.corrupt_items.length} corrupt item(s)` : "";
    byId("lease-summary").textContent =
      `${summary.lease_count} lease(s), ${summary.in_handoff} in handoff, ${summary.at_shard_end} at SHARD_END, ` +
      `${summary.pending_checkpoints} with a prepared checkpoint${corrupt}` +
      (overview.last_round === null ? "" : `; last round ${overview.last_round}`);
    renderCorrupt(summary.corrupt_items);
    fillRows("leases", overview.leases.map(leaseRow));
    fillRows("rounds", overview.rounds.map(roundRow));
    byId("content").hidden = false;
  }

  function renderRunRound(round) {
    byId("run-round-section").hidden = false;
    const list = byId("run-round");
    if (round === null) {
      const note = document.createElement("dd");
      note.textContent = "No figures yet: the run has not finished its round.";
      list.replaceChildren(note);
      return;
    }
    const entries = ["round", "records", "bytes", "files", "seconds", "max_millis_behind_latest", "lost_leases",
      "failed_leases", "retention_losses", "moves"];
    list.replaceChildren(...entries.flatMap((key) => {
      const term = document.createElement("dt");
      term.textContent = key.replaceAll("_", " ");
      const value = document.createElement("dd");
      value.textContent = number(round[key], key === "seconds" ? 1 : 0);
      return [term, value];
    }), ...balanceEntry(round));
  }

  function balanceEntry(round) {
    const term = document.createElement("dt");
    term.textContent = "busiest slot / bound";
    const value = document.createElement("dd");
    value.textContent = balance(round.busiest_over_bound);
    return [term, value];
  }

  function showMessage(text) {
    byId("message").textContent = text;
  }

  async function applicationName() {
    const requested = new URLSearchParams(window.location.search).get("application");
    if (requested) return requested;
    return (await getJson("/api/default-application")).application;
  }

  async function loadApplication() {
    const form = byId("application-form");
    form.hidden = false;
    const application = await applicationName();
    if (!application) {
      showMessage("Enter the name of a KCL application (its lease table).");
      return;
    }
    byId("application-input").value = application;
    renderOverview(await getJson(`/api/applications/${encodeURIComponent(application)}`));
  }

  async function loadDagRun() {
    const path = `/api/dag-runs/${encodeURIComponent(page.dagId)}/${encodeURIComponent(page.runId)}`;
    const run = await getJson(path);
    const heading = byId("run-heading");
    heading.hidden = false;
    heading.textContent = `DAG run ${run.run_id} of ${run.dag_id}`;
    renderRunRound(run.round);
    renderOverview(run.overview);
  }

  let loading = false;

  async function load() {
    if (loading) return;
    loading = true;
    try {
      await (page.view === "dag-run" ? loadDagRun() : loadApplication());
      showMessage("");
      byId("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      byId("content").hidden = true;
      const hint = error.status === 401 ? " Log in to Airflow again." : "";
      showMessage(`Could not load the leases: ${error.message}.${hint}`);
    } finally {
      loading = false;
    }
  }

  byId("application-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const search = new URLSearchParams({ application: byId("application-input").value.trim() });
    window.location.search = search.toString();
  });
  byId("refresh").addEventListener("click", load);
  window.setInterval(load, REFRESH_MILLIS);
  load();
})();
