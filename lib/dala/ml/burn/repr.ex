defmodule Dala.ML.Burn.Repr do
  @moduledoc false
  # The one rule of every `Dala.ML.Burn` function that returns tensors: results come back in the
  # caller's representation.
  #
  #   * Nx input (an `Nx.Tensor` or an `Nx.Batch`) gets Nx tensors on `ExBurn.Backend` (on the
  #     device the result was computed on; Nx tensors of other backends are transferred there).
  #   * Any other input (`ExBurn.Tensor`s, nested lists, numbers, `{binary, type, shape}`) gets
  #     `ExBurn.Tensor`s.
  #
  # The conversions are `ExBurn.Backend.Util.et/2` and `ExBurn.Backend.Util.put/2`: they wrap the same Burn
  # tensor (no copy), so Nx semantics stay in `ExBurn.Backend`. Compiled without Nx too: then no
  # input is Nx and every result is an `ExBurn.Tensor`.

  alias ExBurn.Tensor, as: ET

  # True when `input` is Nx data (an `Nx.Tensor` or an `Nx.Batch`).
  if Code.ensure_loaded?(Nx) do
    def nx?(%Nx.Tensor{}), do: true
    def nx?(%Nx.Batch{}), do: true
  end

  def nx?(_input), do: false

  # `result` (a tensor, or tuples and maps of them, as `Nx.Serving` may return) in `input`'s
  # representation; anything that is not a tensor is returned as it is.
  def like(result, input), do: deep(result, if(nx?(input), do: &to_nx/1, else: &to_et/1))

  defp deep(%ET{} = t, fun), do: fun.(t)
  defp deep(%{__struct__: Nx.Tensor} = t, fun), do: fun.(t)

  defp deep(tuple, fun) when is_tuple(tuple),
    do: tuple |> Tuple.to_list() |> Enum.map(&deep(&1, fun)) |> List.to_tuple()

  defp deep(%{__struct__: _} = other, _fun), do: other
  defp deep(map, fun) when is_map(map), do: Map.new(map, fn {k, v} -> {k, deep(v, fun)} end)
  defp deep(other, _fun), do: other

  # to_nx/1: the Nx tensor (on `ExBurn.Backend`) of a tensor; raises `ExBurn.Error` without Nx.
  # to_et/1: the `ExBurn.Tensor` of a tensor (Nx tensors of other backends are copied to the
  # default device).
  if Code.ensure_loaded?(Nx) do
    def to_nx(%ET{} = t), do: ExBurn.Backend.Util.put(Nx.template(t.shape, t.type), t)
    def to_nx(%Nx.Tensor{data: %ExBurn.Backend{}} = t), do: t
    def to_nx(%Nx.Tensor{} = t), do: Nx.backend_transfer(t, ExBurn.Backend)

    def to_et(%Nx.Tensor{} = t), do: ExBurn.Backend.Util.et(t, nil)
    def to_et(%ET{} = t), do: t
  else
    def to_nx(_tensor), do: raise(ExBurn.Error, op: :to_nx, reason: "Nx is not loaded", details: %{})

    def to_et(%ET{} = t), do: t
  end

  # Frees a tensor of either representation now; `:ok`.
  def deallocate(%ET{} = t) do
    _ = ET.deallocate(t)
    :ok
  end

  if Code.ensure_loaded?(Nx) do
    def deallocate(%Nx.Tensor{} = t) do
      _ = Nx.backend_deallocate(t)
      :ok
    end
  end

  # A new reference to the same Burn tensor: deallocating either one leaves the other usable
  # (what `from_nx/1` and `to_nx/1` hand out, since the caller keeps both).
  def own(%ET{device: device} = t), do: ET.to_device(t, device)
end
