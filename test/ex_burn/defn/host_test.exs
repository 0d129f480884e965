# Compiled only where Nx is present (defn expands at compile time).
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.HostFuns do
    @moduledoc false
    import Nx.Defn

    # native ops on both sides of a reduce with an Elixir function
    defn reduce_between(x, y) do
      a = Nx.exp(x) + y
      r = Nx.reduce(a, 0.0, [axes: [1]], fn p, q -> p + q end)
      r * 2 + Nx.sum(y)
    end

    defn hooked_loop(x) do
      x = Nx.exp(x)

      {i, x} =
        while {i = 0, x}, i < 3 do
          {i + 1, hook(x * 2, :tick)}
        end

      {i * 10, x + 1}
    end

    defn hooked_branches(x) do
      y = x * 3

      if Nx.sum(x) > 0 do
        hook(y + 1, :positive)
      else
        hook(y - 1, :negative)
      end
    end

    # a loop hosted for two reasons: reduce and window_reduce with Elixir functions
    defn loop_with_reduce(x) do
      {_, x} =
        while {i = 0, x}, i < 2 do
          total = Nx.reduce(x, 0.0, fn a, b -> a + b end)
          window = Nx.window_reduce(x, 0.0, {1}, fn a, b -> a + b end)
          {i + 1, x + total + window}
        end

      x
    end

    defn complex_middle(x), do: x |> Nx.multiply(2) |> Nx.fft() |> Nx.abs() |> Nx.add(1)

    defn window_then_dot(x, w) do
      m = Nx.window_reduce(x, -1.0e9, {1, 2}, [strides: [1, 2]], fn a, b -> max(a, b) end)
      Nx.dot(m, w) |> Nx.tanh()
    end

    def plus_opts(t, opts), do: Nx.add(t, opts[:by])

    defn runtime(x) do
      y = Nx.runtime_call(x, x * 2, [by: 5], &__MODULE__.plus_opts/2)
      Nx.sum(y - 1)
    end

    defn bitcast_key(x), do: x |> Nx.multiply(3) |> Nx.bitcast({:f, 32}) |> Nx.bitcast({:u, 32})
  end

  defmodule ExBurn.Defn.HostTest do
    # Graphs with nodes that have no native lowering: only those nodes (or the cond/while
    # holding them) run in Nx.Defn.Evaluator; the rest stays in native program segments.
    use ExUnit.Case, async: false

    @moduletag :nx
    @moduletag :capture_log

    alias ExBurn.Defn.Compiler
    alias ExBurn.Defn.HostFuns, as: F

    import ExBurn.NxCompare, only: [burn: 1, burn: 2, host: 1]

    setup {ExBurn.NxCompare, :binary_default}
    setup do: Compiler.clear_cache()

    defp reference(fun, args, opts \\ []) do
      apply(Nx.Defn.jit(fun, [compiler: Nx.Defn.Evaluator] ++ opts), Enum.map(args, &host/1))
    end

    defp assert_close(got, want), do: ExBurn.NxCompare.assert_same(got, want)

    test "a reduce with an Elixir function is the only node outside the program" do
      x = burn([[0.0, 0.1, 0.2], [0.3, 0.4, 0.5]])
      y = burn([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
      jitted = Nx.Defn.jit(&F.reduce_between/2, compiler: Compiler)
      assert_close(jitted.(x, y), reference(&F.reduce_between/2, [x, y]))

      stats = Compiler.stats()
      assert {stats[:native], stats[:fallback], stats[:hosted], stats[:native_segments]} == {1, nil, 1, 2}
      assert {stats[{:hosted_op, :reduce}], stats[:host_runs]} == {1, 1}

      # the second call reuses the cached plan
      assert_close(jitted.(y, x), reference(&F.reduce_between/2, [y, x]))
      stats = Compiler.stats()
      assert {stats[:cache_hits], stats[:native], stats[:host_runs], stats[:native_runs]} == {1, 1, 2, 2}
    end

    test "a while with a hook inside runs whole on the host; its hook fires per iteration" do
      parent = self()
      hooks = %{tick: &send(parent, {:tick, Nx.to_flat_list(&1)})}
      x = burn([1.0, 2.0])
      {i, got} = Nx.Defn.jit(&F.hooked_loop/1, compiler: Compiler, hooks: hooks).(x)
      {want_i, want} = reference(&F.hooked_loop/1, [x])
      assert_close(got, want)
      assert Nx.to_number(i) == Nx.to_number(want_i)
      assert Nx.to_number(i) == 30

      e = Enum.map([1.0, 2.0], &:math.exp/1)

      for k <- 1..3 do
        assert_received {:tick, ticked}
        expected = Enum.map(e, &(&1 * Integer.pow(2, k)))
        Enum.zip_with(ticked, expected, fn a, b -> assert_in_delta a, b, 1.0e-4 end)
      end

      refute_received {:tick, _}
      # the loop ran once although both of its outputs are used
      stats = Compiler.stats()
      assert {stats[{:hosted_op, :while}], stats[{:fallback_op, :hook}], stats[:host_runs]} == {1, 1, 1}
    end

    test "a hosted cond still runs only the taken branch's hook" do
      parent = self()
      hooks = %{positive: &send(parent, {:positive, &1}), negative: &send(parent, {:negative, &1})}
      jitted = Nx.Defn.jit(&F.hooked_branches/1, compiler: Compiler, hooks: hooks)

      assert Nx.to_flat_list(jitted.(burn([1, 2]))) == [4, 7]
      assert_received {:positive, p}
      assert Nx.to_flat_list(p) == [4, 7]
      refute_received {:negative, _}

      assert Nx.to_flat_list(jitted.(burn([-1, -2]))) == [-4, -7]
      assert_received {:negative, _}
      refute_received {:positive, _}
      assert Compiler.stats()[{:hosted_op, :cond}] == 1
    end

    test "a node hosted for several reasons counts once as a hosted op" do
      x = burn([1.0, 2.0])
      got = Nx.Defn.jit(&F.loop_with_reduce/1, compiler: Compiler).(x)
      # x + sum(x) + x: [1, 2] -> [5, 7] -> [22, 26]
      assert Nx.to_flat_list(got) == [22.0, 26.0]
      stats = Compiler.stats()
      assert {stats[:hosted], stats[{:hosted_op, :while}]} == {1, 1}
      assert {stats[{:fallback_op, :reduce}], stats[{:fallback_op, :window_reduce}]} == {1, 1}
    end

    test "values the program cannot hold pass between host nodes" do
      x = burn([1.0, 2.0, 0.0, -1.0])
      got = Nx.Defn.jit(&F.complex_middle/1, compiler: Compiler).(x)
      assert_close(got, reference(&F.complex_middle/1, [x]))
      stats = Compiler.stats()
      # fft yields c64, so abs (which reads it) is hosted too; multiply and add stay native
      assert {stats[{:hosted_op, :fft}], stats[{:hosted_op, :abs}], stats[:native_segments]} == {1, 1, 2}
    end

    test "a host node's output feeds native ops and its gradient path is unaffected elsewhere" do
      x = burn(Enum.map(0..15, &(&1 / 7.0)), type: :f32) |> Nx.reshape({2, 8})
      w = burn(Enum.map(0..11, &(&1 / 11.0 - 0.5))) |> Nx.reshape({4, 3})
      got = Nx.Defn.jit(&F.window_then_dot/2, compiler: Compiler).(x, w)
      assert_close(got, reference(&F.window_then_dot/2, [x, w]))
      assert Compiler.stats()[{:hosted_op, :window_reduce}] == 1
    end

    test "runtime_call is a host node" do
      got = Nx.Defn.jit(&F.runtime/1, compiler: Compiler).(burn([1, 2, 3]))
      # (2 + 5 - 1) + (4 + 5 - 1) + (6 + 5 - 1)
      assert Nx.to_number(got) == 24
      assert Compiler.stats()[{:hosted_op, :runtime_call}] == 1
    end

    test "bitcast is native" do
      x = burn([1, -2, 7], type: :s32)
      got = Nx.Defn.jit(&F.bitcast_key/1, compiler: Compiler).(x)
      assert got.type == {:u, 32}
      assert Nx.to_flat_list(got) == Nx.to_flat_list(reference(&F.bitcast_key/1, [x]))
      assert {Compiler.stats()[:hosted], Compiler.stats()[:native_runs]} == {nil, 1}
    end

    test "hosting can be turned off with native: false" do
      x = burn([[0.0, 0.1, 0.2], [0.3, 0.4, 0.5]])
      got = Nx.Defn.jit(&F.reduce_between/2, compiler: Compiler, native: false).(x, x)
      assert_close(got, reference(&F.reduce_between/2, [x, x]))
      assert {Compiler.stats()[:fallback], Compiler.stats()[:hosted]} == {1, nil}
    end
  end
end
