defmodule ExBurn.Env do
  @moduledoc """
  The library's run-time environment variables, all read here, and the one rule for settings
  that can come from several places:

      explicit argument or option > environment variable > `config :ex_burn, ...` > default

  | Setting | Variable | Config key | Default | Explicit form |
  |---|---|---|---|---|
  | the default device | `EXBURN_DEVICE` | `:device` | `:auto` | `ExBurn.configure!/1` |
  | the models directory | `EXBURN_MODELS_DIR` | `:models_dir` | `"~/models"` | `:dir` / `:models_dir` options |
  | the server's bearer token | `EXBURN_API_TOKEN` | `:api_token` | `nil` (no authentication) | `ExBurn.Server`'s `:token` |
  | how `:auto` orders the engines | `EXBURN_ENGINE_CHOICE` | `:engine_choice` | `:measure` | |
  | where `:auto` keeps its measured choices | `EXBURN_ENGINE_CACHE` | `:engine_cache` | `"~/.cache/ex_burn/engines"` | |

  The environment beats application config because it is set per run, on the command line or by
  a deployment, while config is compiled into the release. A variable that is unset or empty
  counts as not set. `guides/configuration.md` lists every `EXBURN_*` variable of the project,
  including those the build, tests and benchmarks read.
  """

  # setting (also its config key) => {variable, default}
  @settings %{
    device: {"EXBURN_DEVICE", :auto},
    models_dir: {"EXBURN_MODELS_DIR", "~/models"},
    api_token: {"EXBURN_API_TOKEN", nil},
    engine_choice: {"EXBURN_ENGINE_CHOICE", :measure},
    engine_cache: {"EXBURN_ENGINE_CACHE", "~/.cache/ex_burn/engines"}
  }

  @type setting :: :device | :models_dir | :api_token | :engine_choice | :engine_cache

  @doc "Every setting with its variable and default, as `%{setting => {variable, default}}`."
  def settings, do: @settings

  @doc """
  The value of `setting`: `explicit` unless it is nil, else its environment variable, else
  `config :ex_burn, setting: ...`, else its default.
  """
  @spec get(setting, term) :: term
  def get(setting, explicit \\ nil) do
    {_var, default} = entry!(setting)

    cond do
      explicit != nil -> explicit
      value = env(setting) -> value
      true -> Application.get_env(:ex_burn, setting, default) || default
    end
  end

  @doc "The environment variable of `setting`, or nil when it is unset or empty."
  @spec env(setting) :: String.t() | nil
  def env(setting) do
    {var, _default} = entry!(setting)

    case System.get_env(var) do
      "" -> nil
      value -> value
    end
  end

  defp entry!(setting) do
    case @settings do
      %{^setting => entry} ->
        entry

      _ ->
        raise ExBurn.Error,
          op: :env,
          reason: "unknown setting",
          details: %{setting: setting, known: Map.keys(@settings)}
    end
  end
end
