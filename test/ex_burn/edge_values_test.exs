defmodule ExBurn.EdgeValuesTest do
  # Every elementwise float op at its special and edge inputs (+-0, +-inf, NaN, poles, domain
  # ends, overflow and underflow thresholds, subnormals), in f32 and f64, against IEEE 754 /
  # C99 Annex F values that test/data/gen_edge_values.py computes with mpmath (never from
  # ExBurn's output). Non-finite, zero and exactly specified results must match bit for bit
  # (the sign of a zero or an infinity counts; any NaN is NaN); the others must lie within
  # @ulps of the correctly rounded value.
  #
  # Where Nx.BinaryBackend disagrees with C99 the data follows C99: BinaryBackend's
  # tanh(+-inf) is NaN (C99: +-1), its atan2(-y, -inf) is +pi (C99: -pi) and its sign(NaN) is 1.
  use ExUnit.Case, async: true
  alias ExBurn.Tensor, as: T

  @edge_file Path.expand("../data/edge_values.txt", __DIR__)
  @erf_file Path.expand("../data/erf_f64_reference.txt", __DIR__)
  @external_resource @edge_file
  @external_resource @erf_file

  # Allowed distance in ulps from the correctly rounded result, for the `ulp` rows: Burn's CPU
  # kernels call the platform libm (within an ulp), and the composites (several kernels in a
  # row) compute f32 in f64 and round once.
  @ulps 1

  parse = fn line ->
    [fields | _] = String.split(line, "#", parts: 2)

    case String.split(fields) do
      [op, type, args, out, expected, check] ->
        hex = &String.to_integer(&1, 16)

        {{String.to_atom(op), String.to_atom(type)},
         {Enum.map(String.split(args, ","), hex), String.to_atom(out), hex.(expected), String.to_atom(check),
          String.trim(line)}}

      [] ->
        nil
    end
  end

  groups =
    @edge_file
    |> File.read!()
    |> String.split("\n")
    |> Enum.map(parse)
    |> Enum.reject(&is_nil/1)
    |> Enum.group_by(&elem(&1, 0), &elem(&1, 1))
    |> Enum.sort()

  test "the edge data covers every float unary op and the binary ops with poles" do
    ops = unquote(groups |> Enum.map(fn {{op, _}, _} -> op end) |> Enum.uniq())
    %{floating: floating, same: same, predicate: predicate} = ExBurn.Tensor.Ops.unary_classes()
    assert (floating ++ same ++ predicate ++ [:divide, :pow, :atan2, :remainder]) -- ops == []
  end

  for {{op, type}, rows} <- groups do
    @rows rows
    test "#{op} #{type}" do
      check(unquote(op), unquote(type), @rows)
    end
  end

  describe "f64 erfc and erf_inv" do
    # Relative error at most 1e-15 against mpmath (subnormal results: within 2 ulps), for erfc
    # on [-6, 27] (1 - erf underflows from x = 6 on) and erf_inv on (-1, 1) up to 1 - 2^-53.
    rows =
      @erf_file
      |> File.read!()
      |> String.split("\n")
      |> Enum.flat_map(fn line ->
        case line |> String.split("#", parts: 2) |> hd() |> String.split() do
          [op, x, y] -> [{String.to_atom(op), String.to_integer(x, 16), String.to_integer(y, 16)}]
          _ -> []
        end
      end)
      |> Enum.group_by(&elem(&1, 0), &Tuple.delete_at(&1, 0))

    for {op, cases} <- rows do
      @cases cases
      test "#{op}: relative error <= 1e-15 over #{length(cases)} inputs" do
        {xs, want} = Enum.unzip(@cases)
        got = unquote(op) |> apply_op(:f64, [xs]) |> out_bits(:f64)

        bad =
          for {x, w, g} <- Enum.zip([xs, want, got]),
              err = rel_error(to_f(g, :f64), to_f(w, :f64), ulp_distance(g, w, :f64)),
              err > 1.0e-15,
              do: {to_f(x, :f64), to_f(w, :f64), to_f(g, :f64), err}

        assert bad == [],
               "#{unquote(op)}: {input, want, got, relative error}:\n#{inspect(bad, limit: :infinity)}"
      end
    end
  end

  # -- helpers ---------------------------------------------------------------------------------

  defp check(op, type, rows) do
    args = rows |> Enum.map(&elem(&1, 0)) |> Enum.zip() |> Enum.map(&Tuple.to_list/1)
    out = rows |> hd() |> elem(1)
    got = op |> apply_op(type, args) |> out_bits(out)

    bad =
      for {{_args, _out, want, check, line}, g} <- Enum.zip(rows, got),
          not ok?(g, want, check, out, @ulps) do
        "#{line}\n    got #{show(g, out)}"
      end

    assert bad == [], "#{op} #{type} (#{length(bad)} of #{length(rows)} wrong):\n" <> Enum.join(bad, "\n")
  end

  defp apply_op(op, type, args) do
    tensors = Enum.map(args, fn bits -> T.from_binary(Enum.map_join(bits, &bits_bin(&1, type)), type) end)
    apply(T, op, tensors)
  end

  defp bits_bin(b, :f32), do: <<b::unsigned-32-native>>
  defp bits_bin(b, :f64), do: <<b::unsigned-64-native>>

  defp out_bits(tensor, :u8), do: :binary.bin_to_list(T.to_binary(tensor))
  defp out_bits(tensor, :f32), do: for(<<b::unsigned-32-native <- T.to_binary(tensor)>>, do: b)
  defp out_bits(tensor, :f64), do: for(<<b::unsigned-64-native <- T.to_binary(tensor)>>, do: b)

  defp ok?(got, want, _check, :u8, _tol), do: got == want

  defp ok?(got, want, check, type, tol) do
    cond do
      nan?(want, type) -> nan?(got, type)
      check == :exact -> got == want
      true -> not nan?(got, type) and ulp_distance(got, want, type) <= tol
    end
  end

  defp sign_bit(:f32), do: 0x8000_0000
  defp sign_bit(:f64), do: 0x8000_0000_0000_0000
  defp exp_mask(:f32), do: 0x7F80_0000
  defp exp_mask(:f64), do: 0x7FF0_0000_0000_0000

  defp nan?(b, type) do
    mag = Bitwise.band(b, sign_bit(type) - 1)
    mag > exp_mask(type)
  end

  # Distance in representable values; -0 and +0 are one value here (zeros are checked exactly).
  defp ulp_distance(a, b, type), do: abs(ordered(a, type) - ordered(b, type))

  defp ordered(b, type) do
    if b >= sign_bit(type), do: -(b - sign_bit(type)), else: b
  end

  defp to_f(b, type) do
    if Bitwise.band(b, exp_mask(type)) == exp_mask(type), do: show(b, type), else: decode(b, type)
  end

  defp decode(b, :f32) do
    <<f::float-32>> = <<b::32>>
    f
  end

  defp decode(b, :f64) do
    <<f::float-64>> = <<b::64>>
    f
  end

  defp show(b, :u8), do: Integer.to_string(b)

  defp show(b, type) do
    cond do
      nan?(b, type) -> "nan"
      b == exp_mask(type) -> "inf"
      b == exp_mask(type) + sign_bit(type) -> "-inf"
      true -> "#{inspect(decode(b, type))} (0x#{Integer.to_string(b, 16)})"
    end
  end

  # Relative error of a finite result; subnormal results (below 2.2e-308, where the format has
  # fewer digits) pass within 2 ulps and count 1e-16 per ulp beyond.
  defp rel_error(got, want, ulps) when is_float(got) and is_float(want) do
    cond do
      abs(want) < 2.2250738585072014e-308 -> if ulps <= 2, do: 0.0, else: ulps * 1.0e-16
      true -> abs(got - want) / abs(want)
    end
  end

  defp rel_error(got, want, _ulps), do: if(got == want, do: 0.0, else: :infinity)
end
