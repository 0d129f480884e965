defmodule ExBurn.Model.Data do
  @moduledoc false
  # Turns what users pass as inputs/targets into ExBurn tensors on the model's device:
  # ExBurn.Tensor, {binary, type, shape}, nested lists of numbers, and Nx tensors when Nx is loaded.

  alias ExBurn.Tensor
  import ExBurn.Model.Options, only: [fail!: 3]

  @doc "Inputs for a model: float models get f32, token models s64."
  def inputs!(op, data, model) do
    type = model.spec.input_type
    t = to_tensor!(op, :inputs, data, type, model.device)

    cond do
      type == {:f, 32} and elem(t.type, 0) in [:s, :u] ->
        Tensor.as_type(t, {:f, 32})

      type == {:s, 64} and elem(t.type, 0) in [:f, :bf] ->
        fail!(op, "token inputs must be integers", %{type: t.type})

      true ->
        t
    end
  end

  @doc """
  Targets: for cross-entropy a flat list of integers (class indices) becomes s64, anything else
  f32.
  """
  def targets!(op, data, model) do
    loss = model.config.loss

    type =
      if loss == :cross_entropy and is_list(data) and Enum.all?(data, &is_integer/1),
        do: {:s, 64},
        else: {:f, 32}

    t = to_tensor!(op, :targets, data, type, model.device)
    # Integer targets of any other loss are values, not classes.
    if loss != :cross_entropy and elem(t.type, 0) in [:s, :u], do: Tensor.as_type(t, {:f, 32}), else: t
  end

  @doc "Splits an `{x, y}` data pair."
  def pair!(_op, {x, y}), do: {x, y}
  def pair!(op, other), do: fail!(op, "expected data as an {inputs, targets} tuple", %{got: summarize(other)})

  defp to_tensor!(_op, _what, %Tensor{device: device} = t, _type, device), do: t
  defp to_tensor!(_op, _what, %Tensor{} = t, _type, device), do: Tensor.to_device(t, device)

  defp to_tensor!(_op, _what, {bin, type, shape}, _default, device) when is_binary(bin),
    do: Tensor.from_binary(bin, type, shape: shape, device: device)

  defp to_tensor!(_op, _what, list, type, device) when is_list(list) and list != [],
    do: Tensor.tensor(list, type: type, device: device)

  defp to_tensor!(op, what, other, type, device) do
    case nx(other) do
      {bin, nx_type, shape} -> to_tensor!(op, what, {bin, nx_type, shape}, type, device)
      nil -> fail!(op, "cannot use this as #{what}", %{got: summarize(other), expected: expected()})
    end
  end

  defp expected, do: "an ExBurn.Tensor, {binary, type, shape}, a nested list of numbers or an Nx tensor"

  if Code.ensure_loaded?(Nx) do
    defp nx(%Nx.Tensor{} = t), do: {Nx.to_binary(t), Nx.type(t), Nx.shape(t)}
  end

  defp nx(_other), do: nil

  defp summarize(term) when is_binary(term) and byte_size(term) > 32, do: "<<#{byte_size(term)} bytes>>"
  defp summarize(term), do: term
end
