defmodule ExBurn.Server.Metrics do
  @moduledoc false
  # Request counters in the instance's ETS table (atomic update_counter, no process in the
  # way) and their Prometheus text exposition.

  alias ExBurn.Server.{Instance, Models}

  @doc """
  Counts one request of `route` answered with `status` that took `duration` (native units);
  `aborted` when the client went away before the end of the response.
  """
  def record(config, route, status, duration, aborted \\ false) do
    us = System.convert_time_unit(duration, :native, :microsecond)
    :ets.update_counter(config.table, {:requests, route, status}, 1, {{:requests, route, status}, 0})
    if aborted, do: :ets.update_counter(config.table, {:aborted, route}, 1, {{:aborted, route}, 0})
    :ets.update_counter(config.table, {:latency, route}, [{2, us}, {3, 1}], {{:latency, route}, 0, 0})
    :ok
  end

  @doc "The Prometheus text format (version 0.0.4) of the instance's counters."
  def render(config) do
    requests =
      :ets.match_object(config.table, {{:requests, :_, :_}, :_})
      |> Enum.sort()
      |> Enum.map(fn {{:requests, route, status}, n} ->
        ~s(exburn_http_requests_total{route="#{escape(route)}",status="#{status}"} #{n}\n)
      end)

    latency =
      :ets.match_object(config.table, {{:latency, :_}, :_, :_})
      |> Enum.sort()
      |> Enum.map(fn {{:latency, route}, us, n} ->
        [
          ~s(exburn_http_request_duration_seconds_sum{route="#{escape(route)}"} #{us / 1_000_000}\n),
          ~s(exburn_http_request_duration_seconds_count{route="#{escape(route)}"} #{n}\n)
        ]
      end)

    aborted =
      :ets.match_object(config.table, {{:aborted, :_}, :_})
      |> Enum.sort()
      |> Enum.map(fn {{:aborted, route}, n} ->
        ~s(exburn_http_requests_aborted_total{route="#{escape(route)}"} #{n}\n)
      end)

    uptime = (System.monotonic_time(:millisecond) - config.started_at) / 1000

    [
      "# HELP exburn_http_requests_total HTTP requests answered, by route and status.\n",
      "# TYPE exburn_http_requests_total counter\n",
      requests,
      "# HELP exburn_http_requests_aborted_total Responses cut short because the client went away.\n",
      "# TYPE exburn_http_requests_aborted_total counter\n",
      aborted,
      "# HELP exburn_http_request_duration_seconds Time from request to the end of the response.\n",
      "# TYPE exburn_http_request_duration_seconds summary\n",
      latency,
      "# HELP exburn_http_requests_in_flight Requests being answered now.\n",
      "# TYPE exburn_http_requests_in_flight gauge\n",
      "exburn_http_requests_in_flight #{max(Instance.in_flight(config), 0)}\n",
      "# HELP exburn_models_loaded Models loaded in memory.\n",
      "# TYPE exburn_models_loaded gauge\n",
      "exburn_models_loaded #{length(Models.loaded(config))}\n",
      "# HELP exburn_uptime_seconds Seconds since the server started.\n",
      "# TYPE exburn_uptime_seconds gauge\n",
      "exburn_uptime_seconds #{uptime}\n"
    ]
  end

  defp escape(s), do: s |> String.replace("\\", "\\\\") |> String.replace("\"", "\\\"")
end
