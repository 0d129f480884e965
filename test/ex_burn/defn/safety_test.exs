# Compiled only where Nx is present (defn expands at compile time).
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.SafetyFuns do
    @moduledoc false
    import Nx.Defn

    # one hook node, used inside an `if` branch and after it: the Evaluator fires it once
    defn hook_inside_and_outside(x) do
      y = hook(x * 2, :shared)
      r = if Nx.sum(x) > 0, do: y + 1, else: x
      r + y
    end

    # one hook node used only inside two `if`s: still one firing per call
    defn hook_in_two_ifs(bool, a, b) do
      res = hook(a + b, :shared)
      left = if bool, do: res, else: -res
      right = if bool, do: res * 2, else: res
      left * right
    end

    # runs for billions of iterations
    defn spin(x) do
      {_i, x} = while({i = 0, x}, i >= 0, do: {i + 1, x + 1})
      x
    end

    # a hook inside a loop body fires on every iteration
    defn hook_in_loop(x) do
      {_i, x} =
        while {i = 0, x}, i < 3 do
          {i + 1, hook(x + 1, :shared)}
        end

      x
    end
  end

  defmodule ExBurn.Defn.SafetyTest do
    # Regressions of programs that froze a scheduler, aborted or crashed the VM, filled the
    # compile cache's ETS table with GBs, or failed where Nx.Defn.Evaluator works. The reference
    # is always the Evaluator on Nx.BinaryBackend.
    use ExUnit.Case, async: false

    import ExBurn.NxCompare

    alias ExBurn.Defn.{Compiler, Graph, SafetyFuns}

    @moduletag :nx

    setup :binary_default

    defp jit(fun), do: Nx.Defn.jit(fun, compiler: Compiler)
    defp reference(fun), do: Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator)

    defp cache_words, do: :ets.info(:ex_burn_defn_cache, :memory)

    # singular values equal; U·diag(S)·Vᵀ rebuilds the input (the signs of singular vectors are
    # the algorithm's choice)
    defp assert_svd(t) do
      {u, s, vt} = jit(&Nx.LinAlg.svd/1).(burn_copy(t))
      {_u, s_ref, _vt} = reference(&Nx.LinAlg.svd/1).(t)
      assert_same(s, s_ref, atol: 1.0e-4)
      {m, n} = t.shape
      k = min(m, n)
      rebuilt = host(u)[[.., 0..(k - 1)]] |> Nx.multiply(host(s)) |> Nx.dot(host(vt)[[0..(k - 1), ..]])
      assert Nx.to_number(Nx.all_close(rebuilt, Nx.as_type(t, :f32), atol: 1.0e-4)) == 1
    end

    defp burn_copy(t), do: Nx.backend_copy(t, ExBurn.Backend)

    describe "LinAlg under jit (froze, aborted or crashed the VM)" do
      test "svd of square, tall and wide matrices" do
        assert_svd(Nx.tensor([[1.0, 2.0], [3.0, 4.0]]))
        assert_svd(Nx.iota({3, 3}) |> Nx.add(1))
        assert_svd(Nx.iota({4, 3}) |> Nx.add(1))
        assert_svd(Nx.iota({3, 4}) |> Nx.add(1))
        assert_svd(Nx.multiply(Nx.eye(3), Nx.tensor([1, 1, -1])))
        assert_svd(Nx.tensor([[1.0, -2.0, 0.5, 3.0, 1.0], [0.0, 1.0, 2.0, -1.0, 4.0]], type: :f64))
      end

      test "norm, pinv, matrix_rank and least_squares (their doctests' inputs)" do
        m = Nx.tensor([[1.0, 2.0], [3.0, 4.0]])

        assert_same(
          jit(&Nx.LinAlg.norm(&1, ord: 2)).(burn_copy(m)),
          reference(&Nx.LinAlg.norm(&1, ord: 2)).(m),
          atol: 1.0e-4
        )

        assert_same(jit(&Nx.LinAlg.pinv/1).(burn_copy(m)), reference(&Nx.LinAlg.pinv/1).(m), atol: 1.0e-4)

        batched = Nx.stack([m, Nx.tensor([[2.0, 0.0], [0.0, 0.5]])])

        assert_same(jit(&Nx.LinAlg.pinv/1).(burn_copy(batched)), reference(&Nx.LinAlg.pinv/1).(batched),
          atol: 1.0e-4
        )

        rank = Nx.tensor([[1.0, 2.0], [2.0, 4.0]])

        assert_same(
          jit(&Nx.LinAlg.matrix_rank/1).(burn_copy(rank)),
          reference(&Nx.LinAlg.matrix_rank/1).(rank)
        )

        a = Nx.tensor([[1.0, 2.0], [2.0, 3.0], [3.0, 5.0]])
        b = Nx.tensor([1.0, 2.0, 3.0])
        ls = &Nx.LinAlg.least_squares/2
        assert_same(jit(ls).(burn_copy(a), burn_copy(b)), reference(ls).(a, b), atol: 1.0e-4)
      end

      test "eigh of a symmetric positive-definite 3x3" do
        m = Nx.tensor([[2.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 4.0]])
        {w, v} = jit(&Nx.LinAlg.eigh/1).(burn_copy(m))
        {w_ref, _v} = reference(&Nx.LinAlg.eigh/1).(m)
        assert_same(w, w_ref, atol: 1.0e-4)
        # A·v = v·diag(w)
        assert Nx.to_number(Nx.all_close(Nx.dot(m, host(v)), Nx.multiply(host(v), host(w)), atol: 1.0e-4)) ==
                 1
      end

      test "complex values: eigh of a c64 Hermitian matrix" do
        m = Nx.tensor([[1, Complex.new(0, 1)], [Complex.new(0, -1), 2]], type: :c64)
        got = jit(&Nx.LinAlg.eigh/1).(burn_copy(m))
        assert_same(got, reference(&Nx.LinAlg.eigh/1).(m), atol: 1.0e-5)
      end
    end

    describe "gradients of LinAlg (GBs of ETS, OOM)" do
      test "determinant grad 4x4 and batched, with the cache staying small" do
        Compiler.clear_cache()
        before = cache_words()
        grad = fn t -> Nx.Defn.grad(t, &Nx.LinAlg.determinant/1) end
        m = Nx.iota({4, 4}, type: :f32) |> Nx.add(Nx.eye(4))
        assert_same(jit(grad).(burn_copy(m)), reference(grad).(m), atol: 1.0e-3, rtol: 1.0e-4)

        batched = Nx.stack([m, Nx.multiply(m, 0.5), Nx.add(m, Nx.eye(4))])
        bgrad = fn t -> Nx.Defn.grad(t, &Nx.sum(Nx.LinAlg.determinant(&1))) end
        assert_same(jit(bgrad).(burn_copy(batched)), reference(bgrad).(batched), atol: 1.0e-3, rtol: 1.0e-4)

        # the whole cache for these programs: a few MB at most, not GBs
        assert (cache_words() - before) * :erlang.system_info(:wordsize) < 16 * 1024 * 1024
      end

      test "grads of solve, triangular_solve and lu" do
        a = Nx.tensor([[4.0, 1.0, 0.5], [1.0, 3.0, 0.2], [0.5, 0.2, 2.0]])
        b = Nx.tensor([1.0, 2.0, 3.0])

        for fun <- [
              fn a, b -> Nx.Defn.grad(a, &Nx.sum(Nx.LinAlg.solve(&1, b))) end,
              fn a, b -> Nx.Defn.grad(a, &Nx.sum(Nx.LinAlg.triangular_solve(Nx.tril(&1), b))) end,
              fn a, _b ->
                Nx.Defn.grad(a, fn a ->
                  a |> Nx.LinAlg.lu() |> Tuple.to_list() |> Enum.map(&Nx.sum/1) |> Enum.reduce(&Nx.add/2)
                end)
              end
            ] do
          assert_same(jit(fun).(burn_copy(a), burn_copy(b)), reference(fun).(a, b),
            atol: 1.0e-3,
            rtol: 1.0e-4
          )
        end
      end

      test "the gradient of a complex LU: hosted nodes keep their own operands" do
        # A hosted cond copied a node that was also hosted on its own, both with the node's id:
        # packed together, one version replaced the other, and a complex matrix reached a reshape
        # expecting the s32 pivots (found by Nx's own grad tests through the compiler)
        fun = fn t ->
          Nx.Defn.grad(t, fn x ->
            {p, l, u} = Nx.LinAlg.lu(Nx.pow(x, 2))
            l |> Nx.cos() |> Nx.add(Nx.sin(u)) |> Nx.subtract(Nx.exp(p)) |> Nx.sum()
          end)
        end

        t = Nx.tensor([[Complex.new(0, 1), 2], [1, Complex.new(0, 4)]])
        assert_same(jit(fun).(burn_copy(t)), reference(fun).(t), atol: 1.0e-5, rtol: 1.0e-5)
      end

      test "a 1000-call loop of a compiled LinAlg function keeps memory flat" do
        solve = jit(&Nx.LinAlg.solve/2)
        a = burn_copy(Nx.tensor([[4.0, 1.0], [1.0, 3.0]]))
        b = burn_copy(Nx.tensor([1.0, 2.0]))
        run = fn n -> for _ <- 1..n, do: solve.(a, b) |> Nx.backend_deallocate() end

        run.(50)
        :erlang.garbage_collect()
        {cache, total} = {cache_words(), :erlang.memory(:total)}
        run.(1000)
        :erlang.garbage_collect()

        assert cache_words() == cache
        # 1000 calls may not keep anything: allow allocator noise, not a per-call leak
        assert :erlang.memory(:total) - total < 8 * 1024 * 1024
      end
    end

    describe "arguments" do
      test "an unused template argument is never materialised (Axon's init passes templates)" do
        got =
          Nx.Defn.jit_apply(fn _x, y -> Nx.add(y, 1) end, [Nx.template({2}, :f32), Nx.tensor([1.0, 2.0])],
            compiler: Compiler
          )

        assert_same(got, Nx.tensor([2.0, 3.0]))
      end

      test "unused fields of a container are not loaded" do
        fun = fn %{a: a} -> Nx.multiply(a, 2) end
        got = Nx.Defn.jit_apply(fun, [%{a: Nx.tensor([1, 2]), b: Nx.template({3}, :f32)}], compiler: Compiler)
        assert_same(got, Nx.tensor([2, 4]))
      end
    end

    describe "hooks" do
      test "a hook used inside an if and after it fires once, as under the Evaluator" do
        x = Nx.tensor([1.0, 2.0])

        count = fn compiler ->
          parent = self()
          hooks = %{shared: fn v -> send(parent, {:fired, v}) end}
          result = Nx.Defn.jit(&SafetyFuns.hook_inside_and_outside/1, compiler: compiler, hooks: hooks).(x)

          fired =
            Stream.repeatedly(fn -> receive do: ({:fired, v} -> host(v)), after: (0 -> nil) end)
            |> Enum.take_while(& &1)

          {result, fired}
        end

        {want, want_fired} = count.(Nx.Defn.Evaluator)
        {got, got_fired} = count.(Compiler)
        assert length(want_fired) == 1
        assert got_fired == want_fired
        assert_same(got, want)
      end

      test "hooks in two ifs fire once per call, and in a loop once per iteration" do
        runs = [
          {&SafetyFuns.hook_in_two_ifs/3, [Nx.tensor(0), Nx.tensor(4), Nx.tensor(5)], 1},
          {&SafetyFuns.hook_in_two_ifs/3, [Nx.tensor(1), Nx.tensor(4), Nx.tensor(5)], 1},
          {&SafetyFuns.hook_in_loop/1, [Nx.tensor([1.0, 2.0])], 3}
        ]

        for {fun, args, times} <- runs do
          fired =
            for compiler <- [Nx.Defn.Evaluator, Compiler] do
              parent = self()
              hooks = %{shared: fn v -> send(parent, {:fired, v}) end}
              result = Nx.Defn.jit_apply(fun, args, compiler: compiler, hooks: hooks)
              values = Stream.repeatedly(fn -> receive do: ({:fired, v} -> host(v)), after: (0 -> nil) end)
              {host(result), Enum.take_while(values, & &1)}
            end

          [{want, want_fired}, {got, got_fired}] = fired
          assert length(want_fired) == times
          assert {got, got_fired} == {want, want_fired}
        end
      end
    end

    describe "abandoned work" do
      test "a program whose caller is killed stops instead of holding a dirty scheduler" do
        spin = jit(&SafetyFuns.spin/1)
        x = burn_copy(Nx.tensor(1.0))
        parent = self()

        # one spinning caller per dirty CPU scheduler: if their programs kept running after the
        # kill, the op below would never get a scheduler
        callers =
          for _ <- 1..:erlang.system_info(:dirty_cpu_schedulers) do
            spawn(fn ->
              send(parent, {:started, self()})
              spin.(x)
            end)
          end

        for pid <- callers, do: assert_receive({:started, ^pid}, 5_000)
        Process.sleep(100)
        Enum.each(callers, &Process.exit(&1, :kill))

        task = Task.async(fn -> x |> Nx.add(1) |> Nx.to_number() end)
        assert Task.await(task, 30_000) == 2.0
      end
    end

    describe "vectorized graphs (evaluated whole)" do
      test "grad over tensors with different vectorized axes keeps every view of a shared node" do
        fun = fn x, y -> Nx.Defn.grad({x, y}, fn {a, b} -> Nx.add(a, b) end) end
        x = Nx.tensor([[1.0, 2.0], [3.0, 4.0]]) |> Nx.vectorize(:x)
        y = Nx.tensor([10.0, 20.0]) |> Nx.vectorize(:y)
        {gx, gy} = jit(fun).(burn_copy(x), burn_copy(y))
        {wx, wy} = reference(fun).(x, y)
        assert {gx.vectorized_axes, gy.vectorized_axes} == {wx.vectorized_axes, wy.vectorized_axes}
        assert_same(Nx.devectorize(gx), Nx.devectorize(wx))
        assert_same(Nx.devectorize(gy), Nx.devectorize(wy))
      end

      test "every result is its own reference: transferring them all works and inputs survive" do
        # the two gradients of sin(x + y) are one node: the Evaluator hands back one tensor
        # twice, and transferring the pair freed it before its second use (found by Nx's own
        # grad tests through the compiler)
        fun = fn x, y -> Nx.Defn.grad({x, y}, fn {a, b} -> Nx.sum(Nx.sin(Nx.add(a, b))) end) end
        x = Nx.tensor([0.5, 1.0]) |> Nx.vectorize(:foo)
        y = Nx.tensor([0.0, 0.3]) |> Nx.vectorize(:bar)
        {gx, gy} = jit(fun).(burn_copy(x), burn_copy(y)) |> Nx.backend_transfer()
        {wx, wy} = reference(fun).(x, y)
        assert_same(Nx.devectorize(burn_copy(gx)), Nx.devectorize(wx))
        assert_same(Nx.devectorize(burn_copy(gy)), Nx.devectorize(wy))

        # a vectorized identity returns its input as it came: transferring the result must not
        # free the caller's tensor
        input = burn_copy(x)
        out = jit(fn a -> {a, Nx.multiply(a, 2)} end).(input)
        _ = Nx.backend_transfer(out)
        assert_same(Nx.devectorize(input), Nx.devectorize(x))
      end
    end

    describe "Graph.pack/1" do
      test "a graph with heavy sharing packs to linear size and round-trips" do
        # 40 doublings: unfolded into a tree this graph has 2^40 nodes
        expr =
          Nx.Defn.debug_expr(fn x -> Enum.reduce(1..40, x, fn _, acc -> Nx.add(acc, acc) end) end).(
            Nx.tensor(1.0)
          )

        packed = Graph.pack(expr)
        assert :erts_debug.flat_size(packed) < 40 * 200
        # sharing restored: each use gets its own small tensor struct around the shared node
        # data, so at most twice the original (unfolded it would be 2^40 nodes; == would
        # unfold both graphs)
        assert :erts_debug.size(Graph.unpack(packed)) <= 2 * :erts_debug.size(expr)

        assert Nx.to_number(
                 jit(fn x -> Enum.reduce(1..40, x, fn _, acc -> Nx.add(acc, acc) end) end).(Nx.tensor(1.0))
               ) == 2 ** 40
      end
    end
  end
end
