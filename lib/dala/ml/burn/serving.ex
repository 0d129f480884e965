defmodule Dala.ML.Burn.Serving do
  @moduledoc """
  Production inference for Dala: `build/2`, `run/2`, `batched_run/2` and `supervise/2` over
  `ExBurn.Serving` (an `Nx.Serving` on ExBurn; needs Nx). Without Nx, `ExBurn.Serving.Batcher`
  batches requests for a model with no Nx at all.

  `run/2` and `batched_run/2` answer in the caller's representation (see `Dala.ML.Burn`): Nx
  input (an `Nx.Tensor` or `Nx.Batch`) gets Nx tensors on `ExBurn.Backend`, an `ExBurn.Tensor`,
  a number or a nested list gets `ExBurn.Tensor`s.
  """

  alias Dala.ML.Burn.Repr

  @doc "An `Nx.Serving` for a model or function: see `ExBurn.Serving.build/2`."
  defdelegate build(model_or_fun, opts \\ []), to: ExBurn.Serving

  @doc "Runs one input inline: see `ExBurn.Serving.run/2`; the output is in `input`'s representation."
  def run(serving, input), do: serving |> ExBurn.Serving.run(input) |> Repr.like(input)

  @doc """
  Runs one input on a named serving process, batched: see `ExBurn.Serving.batched_run/2`; the
  output is in `input`'s representation.
  """
  def batched_run(name, input), do: name |> ExBurn.Serving.batched_run(input) |> Repr.like(input)

  @doc "Starts a named serving process: see `ExBurn.Serving.supervise/2`."
  defdelegate supervise(model_or_serving, opts), to: ExBurn.Serving
end
