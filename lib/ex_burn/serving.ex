defmodule ExBurn.Serving do
  @moduledoc """
  Production inference on ExBurn: an `Nx.Serving` for a native `ExBurn.Model` or a numerical
  function, batched, partitioned over devices, supervised and reachable from other BEAM nodes.
  Needs Nx; without it, use `ExBurn.Serving.Batcher` (same batching, no Nx).

      serving = ExBurn.Serving.build(model, batch_size: 32, batch_timeout: 10)
      ExBurn.Serving.run(serving, Nx.tensor([0.5, 1.0]))         # inline, in this process
      {:ok, _} = ExBurn.Serving.supervise(model, name: MyModel, batch_size: 32)
      ExBurn.Serving.batched_run(MyModel, Nx.tensor([0.5, 1.0])) # batched with other callers

  `build/2` options:

    * `:batch_size` (32) and `:batch_timeout` (10 ms) - as in `Nx.Serving.start_link/1`
    * `:device` - `:cpu`, `{kind, index}` or a list of them (default `ExBurn.default_device/0`)
    * `:partitions` - how many partitions (each with its own worker and device, round robin over
      `:device`); default one per device. Set through `Nx.Serving`'s `partitions: true` and the
      compiler's `__partitions_options__/1`.

  A function target receives the stacked batch as an Nx tensor on `ExBurn.Backend` (on its
  partition's device) and is jitted with `ExBurn.Defn.Compiler` when that module exists, else
  `Nx.Defn.Evaluator` (whose ops then run on ExBurn.Backend). A model target runs
  `ExBurn.Model.predict/3`; each partition beyond the first gets its own copy of the model.

  Inputs: an `Nx.Batch` (the output keeps the batch axis), or one sample (an Nx tensor, an
  `ExBurn.Tensor`, a number or nested list) whose output comes back without the batch axis.
  Outputs are Nx tensors on `ExBurn.Backend`; replies to other nodes are copied to
  `Nx.BinaryBackend`.
  """

  alias ExBurn.Error

  @doc "Builds an `Nx.Serving` for `model_or_fun` (see the module doc)."
  def build(model_or_fun, opts \\ []), do: call(:build, [model_or_fun, opts])

  @doc "Runs `input` inline (in this process) on a serving from `build/2`."
  def run(serving, input), do: call(:run, [serving, input])

  @doc """
  Runs `input` on the serving process registered as `name`, batched with other callers'
  inputs; falls back to a serving of that name on another connected node.
  """
  def batched_run(name, input), do: call(:batched_run, [name, input])

  @doc """
  Starts a serving process named `name:`, under the `DynamicSupervisor` given as `supervisor:`
  (else linked to the caller). `model_or_serving` is a model or function (built with the
  `build/2` options in `opts`) or an `Nx.Serving`. Returns `{:ok, pid}`.
  """
  def supervise(model_or_serving, opts), do: call(:supervise, [model_or_serving, opts])

  # The Nx path is compiled only when Nx is loaded; `apply/3` keeps this module warning-free
  # without it.
  defp call(fun, args) do
    if Code.ensure_loaded?(ExBurn.Serving.Nx),
      do: apply(ExBurn.Serving.Nx, fun, args),
      else:
        raise(Error,
          op: :serving,
          reason: "Nx is not loaded; use ExBurn.Serving.Batcher",
          details: %{function: fun}
        )
  end
end
