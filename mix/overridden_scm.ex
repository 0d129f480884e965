defmodule ExBurn.MixProject.OverriddenSCM do
  @moduledoc false
  # Without Hex, Mix cannot even parse a path dependency's own requirement-only deps (Nx's
  # `{:complex, "~> 0.7"}`, Axon's `{:nx, "~> 0.10"}` and its test-only `{:exla, ...}`): it
  # raises before it sees that the top-level project overrides them by path (EXBURN_LOCAL_DEPS)
  # or that they are never needed. This SCM takes any requirement-only dep, so loading succeeds;
  # one that is neither overridden nor filtered out is reported as missing, and it never fetches.
  @behaviour Mix.SCM

  @doc "Registers the SCM (once), after Mix's own, for a build without Hex."
  def register do
    if __MODULE__ not in Mix.SCM.available(), do: Mix.SCM.append(__MODULE__)
  end

  @impl true
  def fetchable?, do: false

  @impl true
  def format(_opts), do: "overridden by a local path dependency"

  @impl true
  def format_lock(_opts), do: nil

  @impl true
  def accepts_options(_app, opts) do
    if not Keyword.has_key?(opts, :path) and not Keyword.has_key?(opts, :git), do: opts
  end

  @impl true
  def checked_out?(_opts), do: false

  @impl true
  def lock_status(_opts), do: :ok

  @impl true
  def equal?(opts1, opts2), do: opts1[:dest] == opts2[:dest]

  @impl true
  def managers(_opts), do: []

  @impl true
  def checkout(opts), do: unreachable(opts)

  @impl true
  def update(opts), do: unreachable(opts)

  defp unreachable(opts) do
    Mix.raise("#{opts[:dest]}: only a local path dependency can provide this package (EXBURN_LOCAL_DEPS)")
  end
end
