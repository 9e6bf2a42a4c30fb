// The history charts of the monitoring page: the last rounds as uPlot charts, oldest to newest, on a UTC
// time axis. Idle rounds (nothing to read) are shaded and have no value, so they never look like zeros.
// Needs uPlot (uplot.iife.min.js, vendored) loaded first; labels and values reach the page as text only.
"use strict";

window.KinesisLeaseCharts = (() => {
  const HEIGHT = 190;
  const MAX_SLOT_SERIES = 8; // more slots than this are drawn as busiest / median / least busy
  // The round's backlog: the leases it left behind their shard's tip (older entries have none).
  const BACKLOG_FIELDS = ["leases_behind", "backlog"];
  const SLOT_COLOURS = ["blue", "violet", "amber", "cyan", "pink", "green", "sky", "purple"];

  function backlogOf(round) {
    const field = BACKLOG_FIELDS.find((name) => round[name] !== undefined && round[name] !== null);
    return field === undefined ? null : round[field];
  }

  function valueOf(round, field) {
    const value = round[field];
    return value === undefined || value === null ? null : Number(value);
  }

  function busyValue(round, value) {
    return round.idle ? null : value;
  }

  // A round's per-slot rows as objects: entries store them compactly ({columns, rows}, `slot` being the
  // slot's index, or its worker id when that is not `<application>-worker-<index>`); older ones as objects.
  function slotsOf(round) {
    const slots = round.slots;
    if (Array.isArray(slots)) return slots.map((slot) => ({ ...slot, id: slotName(slot.worker_id ?? slot.slot) }));
    if (!slots || !Array.isArray(slots.columns) || !Array.isArray(slots.rows)) return [];
    return slots.rows.map((row) => {
      const slot = Object.fromEntries(slots.columns.map((column, i) => [column, row[i]]));
      return { ...slot, id: slotName(slot.slot ?? slot.worker_id) };
    });
  }

  function slotName(id) {
    if (typeof id === "number") return `slot ${id}`;
    const index = /-worker-(\d+)$/.exec(id ?? "");
    return index ? `slot ${index[1]}` : String(id);
  }

  function slotOrder(a, b) {
    const index = (id) => Number.parseInt(id.slice(id.lastIndexOf(" ") + 1), 10);
    const [x, y] = [index(a), index(b)];
    if (!Number.isNaN(x) && !Number.isNaN(y) && x !== y) return x - y;
    return a.localeCompare(b);
  }

  function slotIds(rounds) {
    const ids = new Set(rounds.flatMap((round) => slotsOf(round).map((slot) => slot.id)));
    return [...ids].sort(slotOrder);
  }

  function slotBytes(round, id) {
    if (round.idle) return null;
    const slot = slotsOf(round).find((entry) => entry.id === id);
    return slot ? slot.bytes : null;
  }

  function slotSummary(round) {
    const bytes = slotsOf(round).map((slot) => slot.bytes).sort((a, b) => a - b);
    if (round.idle || bytes.length === 0) return [null, null, null];
    return [bytes[bytes.length - 1], bytes[Math.floor((bytes.length - 1) / 2)], bytes[0]];
  }

  // Each chart: its series (label, colour, axis, values per round, formatter) and its axes.
  function chartDefinitions(rounds, format) {
    const slots = slotIds(rounds);
    const perSlot = slots.length <= MAX_SLOT_SERIES
      ? slots.map((id, i) => ({
        label: id, colour: SLOT_COLOURS[i % SLOT_COLOURS.length], axis: "bytes",
        values: rounds.map((round) => slotBytes(round, id)), format: format.bytes,
      }))
      : ["busiest slot", "median slot", "least busy slot"].map((label, i) => ({
        label, colour: SLOT_COLOURS[i], axis: "bytes",
        values: rounds.map((round) => slotSummary(round)[i]), format: format.bytes,
      }));
    return [
      {
        key: "landed", title: "Landed per round", note: "records and bytes written to the output",
        series: [
          { label: "Records", colour: "blue", axis: "records", bars: true,
            values: rounds.map((r) => busyValue(r, valueOf(r, "records"))), format: format.number },
          { label: "Bytes", colour: "violet", axis: "bytes",
            values: rounds.map((r) => busyValue(r, valueOf(r, "bytes"))), format: format.bytes },
        ],
      },
      {
        key: "backlog", title: "Backlog and lag",
        note: "leases left behind their shard's tip, and the largest lag",
        series: [
          { label: "Max lag", colour: "amber", axis: "millis",
            values: rounds.map((r) => busyValue(r, valueOf(r, "max_millis_behind_latest"))), format: format.millis },
          { label: "Leases behind the tip", colour: "cyan", axis: "count",
            values: rounds.map((r) => busyValue(r, backlogOf(r))), format: format.number },
        ],
      },
      {
        // Every round has a freshness, an idle one too: drawn for all of them.
        key: "freshness", title: "Freshness",
        note: "at each round's end: how old the oldest record the output lacks can be, and the newest it holds",
        series: [
          { label: "Oldest not landed", colour: "red", axis: "millis",
            values: rounds.map((r) => valueOf(r, "oldest_unlanded_age_millis")), format: format.millis },
          { label: "Newest landed", colour: "green", axis: "millis",
            values: rounds.map((r) => valueOf(r, "newest_landed_age_millis")), format: format.millis },
        ],
      },
      {
        key: "balance", title: "Round duration and balance",
        note: "busiest slot over the lower bound max(total / slots, largest lease)",
        series: [
          { label: "Duration", colour: "sky", axis: "seconds", bars: true,
            values: rounds.map((r) => busyValue(r, valueOf(r, "seconds"))), format: format.seconds },
          { label: "Busiest slot / bound", colour: "pink", axis: "ratio",
            values: rounds.map((r) => busyValue(r, valueOf(r, "busiest_over_bound"))), format: format.ratio },
          { label: "Balance lower bound", colour: "gray", axis: "ratio", dash: true,
            values: rounds.map(() => 1), format: format.ratio },
        ],
      },
      {
        key: "moves", title: "Moves and losses", note: "bars: leases moved; dots: rounds with losses or dead letters",
        series: [
          { label: "Moves", colour: "sky", axis: "count", bars: true,
            values: rounds.map((r) => valueOf(r, "moves")), format: format.number },
          // Incidents are dots where they happened; a round without one draws nothing.
          ...[
            ["Lost leases", "lost_leases", "amber"], ["Failed leases", "failed_leases", "red"],
            ["Retention losses", "retention_losses", "purple"], ["Dead-lettered", "dead_lettered", "green"],
            ["Possibly unread", "possibly_unread", "pink"], ["Corrupt items", "corrupt_leases", "stone"],
          ].map(([label, field, colour]) => ({
            label, colour, axis: "count", points: true,
            values: rounds.map((r) => valueOf(r, field) || null),
            legend: (r) => valueOf(r, field), format: format.number,
          })),
        ],
      },
      {
        key: "slots", title: "Per-slot load", wide: true,
        note: slots.length <= MAX_SLOT_SERIES ? "bytes each slot landed" : "bytes landed: busiest, median and least busy slot",
        series: perSlot,
      },
    ];
  }

  const AXIS_FORMATS = {
    records: "number", bytes: "bytes", millis: "millis", seconds: "seconds", ratio: "ratio", count: "number",
  };

  function axesOf(definition, palette, format) {
    const scales = [...new Set(definition.series.map((s) => s.axis))];
    const style = {
      stroke: palette.axis, font: `11px ${palette.font}`, labelFont: `11px ${palette.font}`,
      grid: { stroke: palette.grid, width: 1 }, ticks: { stroke: palette.grid, width: 1 },
    };
    return [
      { ...style, label: "Round finished (UTC)", labelSize: 18, space: 70, values: timeTicks },
      ...scales.slice(0, 2).map((scale, i) => ({
        ...style,
        scale,
        side: i === 0 ? 3 : 1,
        grid: i === 0 ? style.grid : { show: false },
        size: 62,
        values: (u, splits) => splits.map((value) => format[AXIS_FORMATS[scale]](value)),
      })),
    ];
  }

  function seriesOf(definition, rounds, palette, format) {
    const timeSeries = {
      label: "Round",
      value: (u, ts, sidx, idx) => (idx === null || idx === undefined ? "-" : format.roundLabel(rounds[idx])),
    };
    return [timeSeries, ...definition.series.map((entry) => {
      const colour = palette.colour(entry.colour);
      const line = {
        label: entry.label,
        scale: entry.axis,
        stroke: colour,
        width: entry.bars ? 1 : 2,
        spanGaps: false,
        value: (u, value, sidx, idx) => legendValue(rounds[idx], entry.legend ? entry.legend(rounds[idx] ?? {}) : value, entry.format),
        points: { show: Boolean(entry.points), size: 7, fill: colour },
      };
      if (entry.points) line.paths = () => null; // dots only
      if (entry.dash) line.dash = [6, 4];
      if (entry.bars) {
        line.fill = palette.translucent(colour);
        line.paths = window.uPlot.paths.bars({ size: [0.6, 24] });
        line.points = { show: false };
      }
      return line;
    })];
  }

  function legendValue(round, value, formatValue) {
    if (round === undefined) return "-";
    if (round.idle && (value === null || value === undefined)) return "idle";
    return value === null || value === undefined ? "-" : formatValue(value);
  }

  // Shades the idle rounds behind the series: the operator sees "nothing to read", not a zero.
  function idleBands(rounds, palette) {
    return {
      hooks: {
        drawClear: [(u) => {
          const ctx = u.ctx;
          ctx.save();
          ctx.fillStyle = palette.idle;
          const half = Math.max(3, bandHalfWidth(u));
          rounds.forEach((round, idx) => {
            if (!round.idle) return;
            const x = u.valToPos(u.data[0][idx], "x", true);
            ctx.fillRect(x - half, u.bbox.top, half * 2, u.bbox.height);
          });
          ctx.restore();
        }],
      },
    };
  }

  function bandHalfWidth(u) {
    const xs = u.data[0];
    if (xs.length < 2) return 8 * window.devicePixelRatio;
    let gap = Infinity;
    for (let i = 1; i < xs.length; i += 1) {
      gap = Math.min(gap, u.valToPos(xs[i], "x", true) - u.valToPos(xs[i - 1], "x", true));
    }
    return Math.min(gap * 0.45, 12 * window.devicePixelRatio);
  }

  // With no cursor over the charts the legends show the newest round, so the page reads without hovering.
  function newestInLegend(count) {
    const newest = (u) => {
      if (u.cursor.idx === null || u.cursor.idx === undefined) u.setLegend({ idx: count - 1 });
    };
    return { hooks: { ready: [newest], setCursor: [newest] } };
  }

  function createFigure(definition, rounds) {
    const figure = document.createElement("figure");
    figure.className = definition.wide ? "chart wide" : "chart";
    figure.dataset.chart = definition.key;
    figure.dataset.rounds = String(rounds.length);
    figure.dataset.idleRounds = String(rounds.filter((round) => round.idle).length);
    figure.dataset.series = String(definition.series.length);
    const caption = document.createElement("figcaption");
    const title = document.createElement("span");
    title.textContent = definition.title;
    caption.append(title);
    if (definition.note) {
      const note = document.createElement("span");
      note.className = "muted";
      note.textContent = definition.note;
      caption.append(note);
    }
    const plot = document.createElement("div");
    plot.className = "plot";
    figure.append(caption, plot);
    return { figure, plot };
  }

  // Amounts start at zero, so a small round looks small; the balance ratio starts at its bound, 1.
  // The bound line (1.00x) stays clear of the axis; the time axis leaves room for the first and last bars.
  function scalesOf(definition) {
    const scales = { x: { time: true, range: paddedTimeRange } };
    for (const entry of definition.series) {
      scales[entry.axis] = {
        range: entry.axis === "ratio"
          ? (u, min, max) => [0.9, Math.max(1.2, (max ?? 1) * 1.05)]
          : (u, min, max) => [0, Math.max(max ?? 0, 0) * 1.1 || 1],
      };
    }
    return scales;
  }

  function paddedTimeRange(u, min, max) {
    const xs = u.data[0];
    let gap = max - min || 300;
    for (let i = 1; i < xs.length; i += 1) gap = Math.min(gap, xs[i] - xs[i - 1] || gap);
    return [min - gap / 2, max + gap / 2];
  }

  // Tick labels in UTC, 24-hour: "13:40", with the date where the day changes.
  function timeTicks(u, splits) {
    let day = null;
    return splits.map((ts) => {
      const text = new Date(ts * 1000).toISOString();
      const [date, time] = [text.slice(5, 10), text.slice(11, 16)];
      const label = date === day ? time : `${time}\n${date}`;
      day = date;
      return label;
    });
  }

  function plotOptions(definition, rounds, palette, format, width) {
    return {
      width,
      height: HEIGHT,
      tzDate: (ts) => window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"), // tick positions at UTC hours
      cursor: { sync: { key: "kinesis-lease-rounds" }, drag: { x: false, y: false }, points: { size: 6 } },
      scales: scalesOf(definition),
      legend: { live: true },
      axes: axesOf(definition, palette, format),
      series: seriesOf(definition, rounds, palette, format),
      plugins: [idleBands(rounds, palette), newestInLegend(rounds.length)],
    };
  }

  // Draws the charts of `rounds` (newest first, as the API lists them) into `container`; returns a
  // function that resizes them to the container's width.
  function render(container, newestFirst, palette, format) {
    const rounds = newestFirst.filter((round) => round.finished_at).slice().reverse();
    const xs = rounds.map((round) => round.finished_at / 1000);
    const plots = chartDefinitions(rounds, format).map((definition) => {
      const { figure, plot } = createFigure(definition, rounds);
      container.append(figure);
      const data = [xs, ...definition.series.map((entry) => entry.values)];
      const width = Math.max(200, plot.clientWidth);
      return { plot, chart: new window.uPlot(plotOptions(definition, rounds, palette, format, width), data, plot) };
    });
    return {
      resize: () => plots.forEach(({ plot, chart }) => chart.setSize({ width: Math.max(200, plot.clientWidth), height: HEIGHT })),
      destroy: () => plots.forEach(({ chart }) => chart.destroy()),
      charted: rounds.length,
    };
  }

  return { render, backlogOf };
})();
