# Compiled only where Nx is present (defn expands at compile time); the :nx tag keeps it out of
# runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.CompilerFuns do
    @moduledoc false
    import Nx.Defn

    defn affine(x, w, b), do: Nx.dot(x, w) + b

    defn containers(%{a: a, b: b}, {c, d}) do
      %{sum: a + b, pair: {c * 2, Nx.sum(d)}}
    end

    defn loop(x) do
      {i, acc} =
        while {i = 0, acc = x}, i < 5 do
          {i + 1, acc * 2}
        end

      {i, acc}
    end

    defn branch(x) do
      if Nx.sum(x) > 0 do
        x + 1
      else
        x - 1
      end
    end

    defn hooked(x) do
      y = hook(x * 2, :doubled)
      hook(Nx.sum(y), fn v -> send(self(), {:sum_hook, v}) end)
    end

    defn hooked_in_cond(x) do
      if Nx.sum(x) > 0 do
        hook(x + 1, fn v -> send(self(), {:inside, v}) end)
      else
        x
      end
    end

    defn tokened(x), do: tokens(x)

    # The token API is deprecated in Nx 0.13 but still lowered by defn; called through a variable
    # module so the test compiles without deprecation warnings.
    deftransformp tokens(x) do
      kernel = Module.concat(["Nx.Defn.Kernel"])
      token = kernel.create_token()
      {token, y} = kernel.hook_token(token, Nx.add(x, 1), :plus_one)
      kernel.attach_token(token, Nx.multiply(y, 3))
    end

    defn optional_block(x), do: Nx.logsumexp(x, axes: [0])
  end

  defmodule ExBurn.Defn.CompilerTest do
    use ExUnit.Case, async: false

    @moduletag :nx
    @moduletag :capture_log

    alias ExBurn.Defn.Compiler
    alias ExBurn.Defn.CompilerFuns, as: F

    import ExBurn.NxCompare, only: [burn: 1, burn: 2, host: 1]

    setup {ExBurn.NxCompare, :binary_default}

    test "the compiler callbacks" do
      assert Compiler.__to_backend__([]) == {ExBurn.Backend, device: ExBurn.default_device()}
      assert Compiler.__to_backend__(device: :cpu) == {ExBurn.Backend, device: {:cpu, 0}}
      assert Compiler.__partitions_options__(device: :cpu) == [[device: :cpu]]

      assert Compiler.__partitions_options__(devices: [{:cpu, 0}, {:cpu, 1}], hooks: %{}) ==
               [[device: {:cpu, 0}, hooks: %{}], [device: {:cpu, 1}, hooks: %{}]]

      assert Nx.Defn.Compiler.__to_backend__(compiler: Compiler) ==
               {ExBurn.Backend, device: ExBurn.default_device()}
    end

    test "jit runs a graph natively and returns ExBurn tensors; inputs may be on any backend" do
      x = Nx.tensor([[1.0, 2.0], [3.0, 4.0]])
      w = burn([[0.5], [-1.0]])
      got = Nx.Defn.jit(&F.affine/3, compiler: Compiler).(x, w, 0.25)
      assert got.data.__struct__ == ExBurn.Backend
      assert host(got) == Nx.tensor([[-1.25], [-2.25]])
      assert Compiler.stats()[:native_runs] == 1
    end

    test "default_options, jit, compile and jit_apply agree" do
      x = burn([[1.0, 2.0]])
      w = burn([[2.0], [1.0]])
      b = burn([1.0])
      want = Nx.tensor([[5.0]])
      previous = Nx.Defn.default_options(compiler: Compiler)

      try do
        assert host(F.affine(x, w, b)) == want
        assert Compiler.stats()[:native_runs] == 1
      after
        Nx.Defn.default_options(previous)
      end

      assert host(ExBurn.Defn.jit(&F.affine/3).(x, w, b)) == want
      assert host(ExBurn.Defn.jit_apply(&F.affine/3, [x, w, b])) == want
      compiled = Nx.Defn.compile(&F.affine/3, [x, w, b], compiler: Compiler)
      assert host(compiled.(x, w, b)) == want
    end

    test "cached programs are reused for new data with the same templates" do
      parent = self()

      fun = fn x ->
        send(parent, :traced)
        Nx.exp(x) |> Nx.sum()
      end

      jitted = Nx.Defn.jit(fun, compiler: Compiler)
      jitted.(burn([1.0, 2.0]))
      assert_received :traced
      assert_in_delta Nx.to_number(jitted.(burn([0.0, 0.0]))), 2.0, 1.0e-6
      refute_received :traced

      # another shape, type or container is another program
      jitted.(burn([1.0, 2.0, 3.0]))
      assert_received :traced
      jitted.(burn([1, 2], type: :s32))
      assert_received :traced

      stats = Compiler.stats()
      assert {stats[:cache_hits], stats[:cache_misses]} == {1, 3}
    end

    test "containers in and out" do
      out =
        Nx.Defn.jit(&F.containers/2, compiler: Compiler).(
          %{a: burn([1, 2]), b: burn([10, 20])},
          {burn([1.5]), burn([[1, 2], [3, 4]])}
        )

      assert %{sum: sum, pair: {c, d}} = out
      assert Nx.to_flat_list(sum) == [11, 22]
      assert Nx.to_flat_list(c) == [3.0]
      assert Nx.to_number(d) == 10
      assert Compiler.stats()[:native_runs] == 1
    end

    test "while and cond run natively" do
      {i, acc} = Nx.Defn.jit(&F.loop/1, compiler: Compiler).(burn([1.0, -1.0]))
      assert Nx.to_number(i) == 5
      assert Nx.to_flat_list(acc) == [32.0, -32.0]
      assert acc.data.__struct__ == ExBurn.Backend

      assert Nx.to_flat_list(Nx.Defn.jit(&F.branch/1, compiler: Compiler).(burn([1, 2]))) == [2, 3]
      assert Nx.to_flat_list(Nx.Defn.jit(&F.branch/1, compiler: Compiler).(burn([-1, -2]))) == [-2, -3]

      stats = Compiler.stats()
      assert {stats[:fallback], stats[:native_runs]} == {nil, 3}
    end

    test "hooks receive the real values; named hooks can be overridden" do
      parent = self()
      x = burn([1.0, 2.0])
      assert Nx.to_number(Nx.Defn.jit(&F.hooked/1, compiler: Compiler).(x)) == 6.0
      assert_received {:sum_hook, %Nx.Tensor{data: %ExBurn.Backend{}} = v}
      assert Nx.to_number(v) == 6.0

      hooks = %{doubled: &send(parent, {:doubled, Nx.to_flat_list(&1)})}
      Nx.Defn.jit(&F.hooked/1, compiler: Compiler, hooks: hooks).(x)
      assert_received {:doubled, [2.0, 4.0]}
      # both programs ran natively, the hooks after them
      assert {Compiler.stats()[:fallback], Compiler.stats()[:native_runs]} == {nil, 2}
    end

    test "container hooks see the container; a cond with a hook inside is a host node" do
      parent = self()
      hooked = fn x -> Nx.Defn.Kernel.hook({x, Nx.sum(x)}, &send(parent, {:pair, &1})) end
      {a, b} = Nx.Defn.jit(hooked, compiler: Compiler).(burn([1, 2]))
      assert {Nx.to_flat_list(a), Nx.to_number(b)} == {[1, 2], 3}
      assert_received {:pair, {%Nx.Tensor{data: %ExBurn.Backend{}} = ha, hb}}
      assert {Nx.to_flat_list(ha), Nx.to_number(hb)} == {[1, 2], 3}
      assert Compiler.stats()[:fallback] == nil

      assert Nx.to_flat_list(Nx.Defn.jit(&F.hooked_in_cond/1, compiler: Compiler).(burn([1, 2]))) == [2, 3]
      assert_received {:inside, inside}
      assert Nx.to_flat_list(inside) == [2, 3]
      stats = Compiler.stats()
      assert {stats[:fallback], stats[{:fallback_op, :hook}], stats[{:hosted_op, :cond}]} == {nil, 1, 1}
    end

    test "tokens run their hooks" do
      parent = self()
      hooks = %{plus_one: &send(parent, {:plus_one, Nx.to_flat_list(&1)})}
      got = Nx.Defn.jit(&F.tokened/1, compiler: Compiler, hooks: hooks).(burn([1, 2]))
      assert Nx.to_flat_list(got) == [6, 9]
      assert_received {:plus_one, [2, 3]}
      assert Compiler.stats()[:fallback] == nil
    end

    test "blocks lower their default expression natively" do
      x = [[1.0, 2.0], [3.0, 0.5]]
      got = Nx.Defn.jit(&F.optional_block/1, compiler: Compiler).(burn(x))
      want = Nx.logsumexp(Nx.tensor(x), axes: [0])
      assert Nx.to_number(Nx.all_close(host(got), want)) == 1
      assert Compiler.stats()[:native_runs] == 1
    end

    test "literal tensors captured by the function are program inputs" do
      k = Nx.tensor([10, 20, 30])
      got = Nx.Defn.jit(fn x -> Nx.add(x, k) end, compiler: Compiler).(burn([1, 2, 3]))
      assert Nx.to_flat_list(got) == [11, 22, 33]
      assert Compiler.stats()[:native_runs] == 1
    end

    test "native: false forces node-by-node evaluation with the same answer" do
      fun = fn x -> Nx.sum(Nx.multiply(Nx.sin(x), 2)) end
      x = burn([0.5, 1.5])
      a = Nx.Defn.jit(fun, compiler: Compiler).(x)
      b = Nx.Defn.jit(fun, compiler: Compiler, native: false).(x)
      assert Nx.to_number(a) == Nx.to_number(b)
      assert Compiler.stats()[{:fallback_op, :native_disabled}] == 1
    end

    test "errors inside a native program raise like the backend" do
      jitted = Nx.Defn.jit(&Nx.quotient(&1, &2), compiler: Compiler)
      assert_raise ExBurn.Error, fn -> jitted.(burn([1, 2]), burn([1, 0])) end
      assert Nx.to_flat_list(jitted.(burn([4, 9]), burn([2, 3]))) == [2, 3]
    end

    test "the program NIFs reject malformed programs and inputs" do
      dev = ExBurn.default_device()
      assert {:error, {:program_new, _, _}} = ExBurn.Native.program_new(:junk, [], 0, dev)

      # an unknown op, a known op with a wrong attribute, and the former 5-tuple form are named
      # by their position
      for bad <- [
            {:nope, [], {:f, 32}, [1]},
            {{:unary, :no_such_fun}, [], {:f, 32}, [1]},
            {{:reduce, :sum, [0], :maybe}, [], {:f, 32}, [1]},
            {:input, [], 0, {:f, 32}, [2]}
          ] do
        assert {:error, {:program_new, "malformed program instruction", %{index: 1, instruction: text}}} =
                 ExBurn.Native.program_new([{{:input, 0}, [], {:f, 32}, [1]}, bad], [0], 1, dev)

        op = elem(bad, 0)
        assert text =~ Atom.to_string(if is_tuple(op), do: elem(op, 0), else: op)
      end

      # well formed, but reading an operand that does not precede it
      assert {:error, {:program_new, _, _}} =
               ExBurn.Native.program_new([{{:unary, :exp}, [0], {:f, 32}, [1]}], [0], 0, dev)

      {:ok, prog} = ExBurn.Native.program_new([{{:input, 0}, [], {:f, 32}, [2]}], [0], 1, dev)
      assert {:error, {:program_run, _, _}} = ExBurn.Native.program_run(prog, [])
      assert {:error, {:program_run, _, _}} = ExBurn.Native.program_run(:junk, [])
      wrong = burn([1.0, 2.0, 3.0])
      assert {:error, {:program_run, _, _}} = ExBurn.Native.program_run(prog, [wrong.data.ref])
    end

    test "unsupported ops are named in the stats, never silently dropped" do
      got = Nx.Defn.jit(fn x -> Nx.reduce(x, 0, &Nx.add/2) end, compiler: Compiler).(burn([3, 1, 2]))
      assert Nx.to_flat_list(got) == [6]
      assert Compiler.stats()[{:fallback_op, :reduce}] == 1
    end

    test "the cache keeps the most recently used programs up to :defn_cache_size" do
      previous = Application.get_env(:ex_burn, :defn_cache_size)
      Application.put_env(:ex_burn, :defn_cache_size, 2)
      Compiler.clear_cache()

      on_exit(fn ->
        if previous,
          do: Application.put_env(:ex_burn, :defn_cache_size, previous),
          else: Application.delete_env(:ex_burn, :defn_cache_size)
      end)

      jitted = Nx.Defn.jit(&Nx.add(&1, 1), compiler: Compiler)
      [a, b, c] = [burn([1]), burn([1, 2]), burn([1, 2, 3])]
      jitted.(a)
      jitted.(b)
      # a was used last, so c's program evicts b's
      jitted.(a)
      assert Nx.to_flat_list(jitted.(c)) == [2, 3, 4]
      assert {Compiler.cache_size(), Compiler.stats()[:evictions]} == {2, 1}

      jitted.(a)
      assert Compiler.stats()[:cache_hits] == 2
      jitted.(b)
      assert {Compiler.stats()[:cache_misses], Compiler.stats()[:evictions]} == {4, 2}
    end

    test "sharding raises instead of running each shard alone" do
      mesh = %Nx.Mesh{name: "mesh", shape: {2}}
      sharded = Nx.Defn.shard_jit(&Nx.add(&1, &1), mesh, compiler: Compiler)

      assert_raise ArgumentError, ~r/does not support sharding/, fn ->
        sharded.([[burn([1])], [burn([2])]])
      end
    end

    test "vectorized parameters still run the whole graph node by node" do
      x = Nx.vectorize(burn([[1, 2], [3, 4]]), :rows)
      got = Nx.Defn.jit(&Nx.sum/1, compiler: Compiler).(x)
      assert got.vectorized_axes == [rows: 2]
      assert Nx.to_flat_list(Nx.devectorize(got)) == [3, 7]
      assert {Compiler.stats()[:fallback], Compiler.stats()[{:fallback_op, :vectorized}]} == {1, 1}
    end
  end
end
