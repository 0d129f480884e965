defmodule Dala.ML.Burn.Serving do
  @moduledoc """
  Production inference for Dala: `build/2`, `run/2`, `batched_run/2` and `supervise/2` over
  `ExBurn.Serving` (an `Nx.Serving` on ExBurn; needs Nx). Without Nx, `ExBurn.Serving.Server`
  batches requests for a model with no Nx at all.
  """

  @doc "An `Nx.Serving` for a model or function: see `ExBurn.Serving.build/2`."
  defdelegate build(model_or_fun, opts \\ []), to: ExBurn.Serving

  @doc "Runs one input inline: see `ExBurn.Serving.run/2`."
  defdelegate run(serving, input), to: ExBurn.Serving

  @doc "Runs one input on a named serving process, batched: see `ExBurn.Serving.batched_run/2`."
  defdelegate batched_run(name, input), to: ExBurn.Serving

  @doc "Starts a named serving process: see `ExBurn.Serving.supervise/2`."
  defdelegate supervise(model_or_serving, opts), to: ExBurn.Serving
end
