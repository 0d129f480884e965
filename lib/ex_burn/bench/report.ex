defmodule ExBurn.Bench.Report do
  @moduledoc """
  Renders `ExBurn.Bench.run/2`'s results as one self-contained HTML page (inline CSS and SVG,
  no scripts, no external resources): per suite a throughput chart and a latency-percentile
  chart per engine × device (the Python references beside them), the ExBurn / reference ratio
  table, the environment (CPU, GPUs, load average, versions, compiled backends) and the notes.
  """

  # One color per implementation, so a chart reads the same across suites.
  @colors %{"burn" => "#e4572e", "candle" => "#2e86ab", "python" => "#76b041"}
  @percentile_shades ["#4c6a92", "#8fa8c8", "#c9d6e8"]

  @doc "The report page for `results`."
  def html(results) do
    suites = results.cases |> Enum.map(& &1.suite) |> Enum.uniq()

    """
    <!DOCTYPE html>
    <html lang="en"><head><meta charset="utf-8"><title>ExBurn benchmark report</title>
    <style>
    body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
    h1{margin-bottom:4px} h2{margin-top:32px;border-bottom:1px solid #ddd}
    table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:4px 8px;text-align:left}
    .num{text-align:right;font-variant-numeric:tabular-nums} .good{background:#e3f4e1} .bad{background:#fbe3df}
    .legend span{display:inline-block;margin-right:16px} .swatch{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}
    </style></head><body>
    <h1>ExBurn benchmark report</h1>
    <p>#{esc(results.environment.date)} · load average #{esc(results.environment.load_average)} · #{results.environment.iterations} iterations per case</p>
    #{legend()}
    #{Enum.map_join(suites, "\n", &suite_section(&1, results))}
    #{ratio_section(results.ratios)}
    #{environment_section(results.environment)}
    #{notes_section(results.notes)}
    </body></html>
    """
  end

  defp legend do
    items =
      Enum.map_join(@colors, "", fn {name, color} ->
        ~s(<span><i class="swatch" style="background:#{color}"></i>#{name}</span>)
      end)

    ~s(<p class="legend">#{items}</p>)
  end

  defp suite_section(suite, results) do
    cases = Enum.filter(results.cases, &(&1.suite == suite))
    names = cases |> Enum.map(& &1.case) |> Enum.uniq()

    charts =
      Enum.map_join(names, "\n", fn name ->
        rows = Enum.filter(cases, &(&1.case == name))
        unit = hd(rows).unit

        throughput =
          bar_chart(
            "#{suite} · #{name} · throughput (#{unit})",
            Enum.map(rows, &{label(&1), &1.throughput || 0, color(&1)}),
            &fmt/1
          )

        latency = latency_chart("#{suite} · #{name} · latency (ms: p50, p90, p99)", rows)
        ~s(<div class="case">#{throughput}#{latency}#{case_table(rows)}</div>)
      end)

    ~s(<h2 id="suite-#{esc(suite)}">#{esc(suite)}</h2>\n#{charts})
  end

  defp label(c), do: "#{c.engine} #{c.device} (#{c.implementation})"
  defp color(c), do: Map.get(@colors, c.engine, "#888888")

  @bar_h 22
  @label_w 330
  @chart_w 760

  @doc false
  # A horizontal bar chart: one bar per {label, value, color}, scaled to the largest value.
  def bar_chart(title, rows, format) do
    max = rows |> Enum.map(&elem(&1, 1)) |> Enum.max(fn -> 0 end)
    width = @chart_w - @label_w - 90
    height = 30 + length(rows) * (@bar_h + 6)

    bars =
      rows
      |> Enum.with_index()
      |> Enum.map_join("", fn {{label, value, color}, i} ->
        y = 26 + i * (@bar_h + 6)
        w = if max > 0, do: max(value / max * width, 1), else: 1

        ~s(<text x="#{@label_w - 6}" y="#{y + 15}" text-anchor="end" font-size="12">#{esc(label)}</text>) <>
          ~s(<rect class="bar" x="#{@label_w}" y="#{y}" width="#{round1(w)}" height="#{@bar_h}" fill="#{color}"/>) <>
          ~s(<text x="#{@label_w + round1(w) + 6}" y="#{y + 15}" font-size="12">#{esc(format.(value))}</text>)
      end)

    ~s(<svg xmlns="http://www.w3.org/2000/svg" width="#{@chart_w}" height="#{height}" role="img"><title>#{esc(title)}</title>) <>
      ~s(<text x="0" y="16" font-size="14" font-weight="bold">#{esc(title)}</text>#{bars}</svg>)
  end

  defp latency_chart(title, rows) do
    max = rows |> Enum.map(& &1.p99_ms) |> Enum.max(fn -> 0 end)
    width = @chart_w - @label_w - 90
    group = 3 * 9 + 8
    height = 30 + length(rows) * group

    bars =
      rows
      |> Enum.with_index()
      |> Enum.map_join("", fn {c, i} ->
        y = 26 + i * group

        ps =
          [c.p50_ms, c.p90_ms, c.p99_ms]
          |> Enum.zip(@percentile_shades)
          |> Enum.with_index()
          |> Enum.map_join("", fn {{v, shade}, j} ->
            w = if max > 0, do: max(v / max * width, 1), else: 1

            ~s(<rect class="bar" x="#{@label_w}" y="#{y + j * 9}" width="#{round1(w)}" height="8" fill="#{shade}"/>) <>
              ~s(<text x="#{@label_w + round1(w) + 4}" y="#{y + j * 9 + 8}" font-size="9">#{fmt(v)}</text>)
          end)

        ~s(<text x="#{@label_w - 6}" y="#{y + 17}" text-anchor="end" font-size="12">#{esc(label(c))}</text>#{ps})
      end)

    ~s(<svg xmlns="http://www.w3.org/2000/svg" width="#{@chart_w}" height="#{height}" role="img"><title>#{esc(title)}</title>) <>
      ~s(<text x="0" y="16" font-size="14" font-weight="bold">#{esc(title)}</text>#{bars}</svg>)
  end

  defp case_table(rows) do
    body =
      Enum.map_join(rows, "", fn c ->
        "<tr><td>#{esc(label(c))}</td><td class=num>#{fmt(c.p50_ms)}</td><td class=num>#{fmt(c.p90_ms)}</td>" <>
          "<td class=num>#{fmt(c.p99_ms)}</td><td class=num>#{fmt(c.throughput)} #{esc(c.unit)}</td></tr>"
      end)

    "<table><tr><th>implementation</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>throughput</th></tr>#{body}</table>"
  end

  defp ratio_section([]), do: "<h2>Ratios</h2><p>No reference ran (use <code>--compare python</code>).</p>"

  defp ratio_section(ratios) do
    rows =
      Enum.map_join(ratios, "", fn r ->
        class = if r.ratio <= 1.0, do: "good", else: "bad"

        "<tr><td>#{esc(r.suite)}</td><td>#{esc(r.case)}</td><td>#{esc(r.engine)} #{esc(r.device)}</td><td>#{esc(r.reference)}</td>" <>
          "<td class=num>#{fmt(r.exburn_ms)}</td><td class=num>#{fmt(r.reference_ms)}</td><td class=\"num #{class}\">#{fmt(r.ratio)}</td></tr>"
      end)

    "<h2>Ratios</h2><p>Time per item, ExBurn / reference (from the medians): below 1 means ExBurn is faster.</p>" <>
      "<table id=ratios><tr><th>suite</th><th>case</th><th>ExBurn</th><th>reference</th><th>ExBurn ms</th><th>reference ms</th><th>ratio</th></tr>#{rows}</table>"
  end

  defp environment_section(env) do
    rows =
      Enum.map_join(env, "", fn {k, v} ->
        v = if is_list(v), do: Enum.join(v, ", "), else: to_string(v)
        "<tr><th>#{esc(to_string(k))}</th><td>#{esc(v)}</td></tr>"
      end)

    "<h2>Environment</h2><table id=environment>#{rows}</table>"
  end

  defp notes_section([]), do: ""

  defp notes_section(notes),
    do: "<h2>Notes</h2><ul>" <> Enum.map_join(notes, "", &"<li>#{esc(&1)}</li>") <> "</ul>"

  defp fmt(nil), do: "n/a"
  defp fmt(x) when is_integer(x), do: Integer.to_string(x)
  defp fmt(x) when x >= 1000, do: x |> round() |> Integer.to_string()
  defp fmt(x) when x >= 10, do: :erlang.float_to_binary(x / 1, decimals: 1)
  defp fmt(x), do: :erlang.float_to_binary(x / 1, decimals: 3)

  defp round1(x), do: Float.round(x / 1, 1)

  defp esc(text) do
    text
    |> to_string()
    |> String.replace("&", "&amp;")
    |> String.replace("<", "&lt;")
    |> String.replace(">", "&gt;")
    |> String.replace("\"", "&quot;")
  end
end
