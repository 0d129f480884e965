# Compiled only where Nx is present; the :nx tag keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  Code.require_file("../../support/program_gen.exs", __DIR__)

  defmodule ExBurn.Defn.GeneratedTest do
    # Seeded random programs (test/support/program_gen.exs), each jitted with
    # ExBurn.Defn.Compiler on ExBurn.Backend inputs and compared with Nx.Defn.Evaluator on
    # Nx.BinaryBackend inputs. Programs like these froze or killed the VM (svd, pinv, eigh under
    # jit); every program runs in its own process with a deadline, so a hang is a failure that
    # names the program instead of a stuck suite.
    #
    # A failure message holds, for every failing program, its seed and index
    # (`ExBurn.ProgramGen.program(seed, index)` rebuilds it) and its code and inputs.
    # EXBURN_GEN_SEED / EXBURN_GEN_COUNT run other programs (exploration; the fixed ones are the
    # regression).
    use ExUnit.Case, async: false

    import ExBurn.NxCompare

    alias ExBurn.Defn.Compiler
    alias ExBurn.ProgramGen

    @moduletag :nx
    @moduletag timeout: 600_000

    @seed 20_250_611
    @count 200

    # a program (compile and two runs) that takes longer than this is a hang
    @deadline_ms 60_000

    # nodes a program may send through the Evaluator (host nodes, `{:hosted_op, op}` and
    # `{:fallback_op, reason}` in the stats) by kind: LinAlg decompositions are Nx.Block nodes
    # and triangular solves that run node by node; nothing else may leave the native program
    @hosted_ok %{linalg: [:block, :triangular_solve, :cond, :while]}

    setup :binary_default

    defp seed, do: String.to_integer(System.get_env("EXBURN_GEN_SEED", "#{@seed}"))
    defp count, do: String.to_integer(System.get_env("EXBURN_GEN_COUNT", "#{@count}"))

    defp cache_bytes, do: :ets.info(:ex_burn_defn_cache, :memory) * :erlang.system_info(:wordsize)

    test "seeded random programs agree with the Evaluator on BinaryBackend" do
      Compiler.clear_cache()
      Compiler.reset_stats()
      cache_before = cache_bytes()
      started = System.monotonic_time(:millisecond)

      results =
        for index <- 0..(count() - 1) do
          case guarded(fn -> ProgramGen.program(seed(), index) end) do
            {:ok, program} ->
              before = Compiler.stats()
              outcome = run_program(program)
              delta = stats_delta(before, Compiler.stats())
              {program, outcome ++ stats_problems(program, delta), cache_bytes() - cache_before}

            {:error, message} ->
              program = %{index: index, seed: seed(), kind: :generator, attempt: 0}
              {program, ["generating the program failed: #{message}"], cache_bytes() - cache_before}
          end
        end

      elapsed = System.monotonic_time(:millisecond) - started
      stats = Compiler.stats()
      by_kind = results |> Enum.frequencies_by(fn {p, _, _} -> p.kind end) |> Enum.sort()
      programs = for {%{kind: kind} = p, _, _} <- results, kind != :generator, do: p
      regenerated = programs |> Enum.map(& &1.attempt) |> Enum.sum()
      fallbacks = programs |> Enum.map(& &1.fallbacks) |> Enum.sum()
      peak_cache = results |> Enum.map(&elem(&1, 2)) |> Enum.max()

      IO.puts(
        "\n#{count()} generated programs (seed #{seed()}) in #{elapsed} ms: #{inspect(by_kind)}; " <>
          "#{regenerated} candidates the reference could not run were regenerated, " <>
          "#{fallbacks} proposal loops ended on their fallback op; cache grew by at most " <>
          "#{div(peak_cache, 1024)} KiB; stats #{inspect(Map.take(stats, [:native, :fallback, :hosted, :cache_misses, :cache_hits, :native_runs, :host_runs, :evictions]))}"
      )

      failures = for {program, [_ | _] = problems, _} <- results, do: report(program, problems)

      assert failures == [],
             "#{length(failures)} of #{count()} programs failed:\n\n" <> Enum.join(failures, "\n")

      # no whole-graph evaluator fallbacks: nothing here is vectorized
      assert Map.get(stats, :fallback, 0) == 0, "fallbacks: #{inspect(stats)}"
      # nodes run outside the native program only for LinAlg (checked per program above)
      allowed = @hosted_ok |> Map.values() |> List.flatten()

      assert for(
               {{tag, op}, _} = entry <- stats,
               tag in [:hosted_op, :fallback_op],
               op not in allowed,
               do: entry
             ) == []

      # every program compiled once (identical programs share an entry), then a cache hit
      assert stats[:cache_misses] + stats[:cache_hits] == 2 * count()
      assert stats[:cache_hits] >= count()
      # the compile cache for all of them: a few MB, not GBs of unfolded graphs
      assert peak_cache < 64 * 1024 * 1024
    end

    ## Running one program

    # a list of problems (strings); [] when ExBurn agrees with the reference
    defp run_program(program) do
      fun = ProgramGen.fun(program)
      host_inputs = Enum.map(program.inputs, &Nx.backend_copy(&1, Nx.BinaryBackend))
      burn_inputs = Enum.map(program.inputs, &Nx.backend_copy(&1, ExBurn.Backend))

      case guarded(fn -> apply(Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator), host_inputs) end) do
        {:ok, want} ->
          jitted = Nx.Defn.jit(fun, compiler: Compiler)

          # compiled once, then a cached run: both must agree with the reference
          case guarded(fn -> {apply(jitted, burn_inputs), apply(jitted, burn_inputs)} end) do
            {:ok, {first, second}} -> checked(program, first, want) ++ checked(program, second, want)
            {:error, message} -> ["ExBurn: #{message}"]
          end

        {:error, message} ->
          # the generator keeps only programs the reference runs
          ["the reference raised (a generator bug): #{message}"]
      end
    end

    # runs `fun` in its own process: an exception, exit or hang is a problem, not a crash of
    # the whole run
    defp guarded(fun) do
      parent = self()

      {pid, ref} =
        spawn_monitor(fn ->
          Nx.default_backend(Nx.BinaryBackend)

          result =
            try do
              {:ok, fun.()}
            rescue
              e -> {:error, Exception.format(:error, e, __STACKTRACE__) |> String.slice(0, 2_000)}
            catch
              kind, reason -> {:error, "#{kind}: #{inspect(reason)}"}
            end

          send(parent, {:result, self(), result})
        end)

      receive do
        {:result, ^pid, result} ->
          Process.demonitor(ref, [:flush])
          result

        {:DOWN, ^ref, :process, ^pid, reason} ->
          {:error, "process died: #{inspect(reason)}"}
      after
        @deadline_ms ->
          Process.exit(pid, :kill)
          {:error, "no result after #{@deadline_ms} ms (hung)"}
      end
    end

    defp checked(program, got, want) do
      compare(program, got, want)
    rescue
      e -> ["comparing raised: " <> Exception.format(:error, e, __STACKTRACE__)]
    end

    defp compare(%{compare: :close, tols: tols}, got, want) do
      got_list = Nx.Defn.Composite.flatten_list([got])
      want_list = Nx.Defn.Composite.flatten_list([want])

      if length(got_list) != length(want_list) or not same_structure?(got, want) do
        ["result structure differs: got #{inspect(got)}, want #{inspect(want)}"]
      else
        # a value computed through f32 is good to f32's digits even when the result is f64
        [got_list, want_list, tols]
        |> Enum.zip_with(fn [got, want, err] ->
          tensor_problem(got, want, ProgramGen.tol(err || want.type))
        end)
        |> Enum.reject(&is_nil/1)
      end
    end

    defp compare(%{compare: {:linalg, op, opts}}, got, want), do: linalg_problems(op, opts, got, want)

    defp same_structure?(got, want) do
      strip = fn c -> Nx.Defn.Composite.traverse(c, fn _ -> 0 end) end
      strip.(got) == strip.(want)
    end

    # nil when `got` is an ExBurn.Backend tensor of `want`'s shape, type and names, with equal
    # integers and floats within `{atol, rtol}` (NaN equal to NaN, infinities equal)
    defp tensor_problem(got, want, {atol, rtol}) do
      assert_same(got, want, atol: atol, rtol: rtol)
      nil
    rescue
      e in ExUnit.AssertionError -> "#{e.message}\n  got #{inspect(got)}\n  want #{inspect(want)}"
    end

    ## LinAlg: compare what is unique; for decompositions with sign/order freedom, invariants

    defp linalg_problems(op, opts, got, want) do
      got_list = Tuple.to_list(got)
      want_list = Tuple.to_list(want)
      # the inputs (built in the program or passed through) and the result
      {got_res, got_ins} = List.pop_at(got_list, -1)
      {want_res, want_ins} = List.pop_at(want_list, -1)
      type = want_ins |> hd() |> Map.fetch!(:type)
      {atol, rtol} = linalg_tol(type, hd(want_ins))

      # the result's tensors: ExBurn.Backend, same shapes and types
      structure =
        Nx.Defn.Composite.flatten_list([got_res])
        |> Enum.zip(Nx.Defn.Composite.flatten_list([want_res]))
        |> Enum.map(fn {g, w} ->
          cond do
            g.data.__struct__ != ExBurn.Backend ->
              "#{op} result is not an ExBurn.Backend tensor"

            {g.shape, g.type} != {w.shape, w.type} ->
              "#{op} result #{inspect({g.shape, g.type})}, want #{inspect({w.shape, w.type})}"

            true ->
              nil
          end
        end)

      inputs = Enum.zip_with(got_ins, want_ins, &tensor_problem(&1, &2, ProgramGen.tol(&2.type)))

      if Enum.any?(structure ++ inputs) do
        Enum.reject(structure ++ inputs, &is_nil/1)
      else
        a = host64(hd(got_ins))
        res = Nx.Defn.Composite.traverse(got_res, &host64/1)
        ref = Nx.Defn.Composite.traverse(want_res, &host64/1)
        b = if length(got_ins) > 1, do: host64(Enum.at(got_ins, 1))
        invariants(op, opts, a, b, res, ref, {atol, rtol}) |> Enum.reject(&is_nil/1)
      end
    end

    defp host64(t), do: t |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.as_type({:f, 64})

    # tolerances relative to the matrix's size (entries up to ~6, n up to 5)
    defp linalg_tol(type, a) do
      scale = max(1.0, a |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number())

      case type do
        {:f, 64} -> {1.0e-9 * scale, 1.0e-9}
        _ -> {1.0e-4 * scale, 1.0e-4}
      end
    end

    defp close(label, got, want, {atol, rtol}) do
      if Nx.to_number(Nx.all_close(got, want, atol: atol, rtol: rtol, equal_nan: false)) == 1,
        do: nil,
        else: "#{label}: got #{inspect(got)}\n  want #{inspect(want)}"
    end

    defp mT(t), do: Nx.transpose(t, axes: last_two(t))
    defp last_two(t), do: Enum.to_list(0..(Nx.rank(t) - 3)//1) ++ [Nx.rank(t) - 1, Nx.rank(t) - 2]
    defp matmul(a, b), do: Nx.dot(a, [-1], batch(a), b, [-2], batch(b))
    defp batch(t), do: Enum.to_list(0..(Nx.rank(t) - 3)//1)

    defp identity_like(t) do
      n = elem(t.shape, Nx.rank(t) - 1)
      Nx.eye(n, type: {:f, 64}) |> Nx.broadcast(put_elem(t.shape, Nx.rank(t) - 2, n))
    end

    defp col_slice(t, k), do: Nx.slice_along_axis(t, 0, k, axis: -1)
    defp row_slice(t, k), do: Nx.slice_along_axis(t, 0, k, axis: -2)

    # Nx's iterative decompositions stop at their own tolerance (eigh: `eps: 1.0e-4`), so a
    # residual is judged against the reference's residual for the same input: ExBurn's may not
    # be worse than the reference's (plus the tolerance)
    defp residual(got, want), do: Nx.subtract(got, want) |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()

    defp no_worse(label, got_residual, ref_residual, {atol, _rtol}) do
      if got_residual <= 2 * ref_residual + atol,
        do: nil,
        else: "#{label}: residual #{got_residual}, the reference's #{ref_residual} (atol #{atol})"
    end

    defp invariants(:qr, _opts, a, _b, {q, r}, {q_ref, r_ref}, tol) do
      [
        no_worse("Q·R = A", residual(matmul(q, r), a), residual(matmul(q_ref, r_ref), a), tol),
        no_worse(
          "QᵀQ = I",
          residual(matmul(mT(q), q), identity_like(q)),
          residual(matmul(mT(q_ref), q_ref), identity_like(q_ref)),
          tol
        ),
        close("R upper triangular", Nx.multiply(r, strictly_lower(r)), Nx.broadcast(0.0, r.shape), tol),
        # R is unique up to the signs of its rows
        close("|R|", Nx.abs(r), Nx.abs(r_ref), tol)
      ]
    end

    defp invariants(:svd, _opts, a, _b, {u, s, vt}, {u_ref, s_ref, vt_ref}, tol) do
      rebuilt = fn u, s, vt ->
        k = elem(s.shape, Nx.rank(s) - 1)
        matmul(Nx.multiply(col_slice(u, k), Nx.new_axis(s, -2)), row_slice(vt, k))
      end

      ref_residual = residual(rebuilt.(u_ref, s_ref, vt_ref), a)
      got_residual = residual(rebuilt.(u, s, vt), a)
      {atol, rtol} = tol

      [
        # singular values move by at most the residual
        close("singular values", s, s_ref, {atol + ref_residual + got_residual, rtol}),
        no_worse("U·S·Vᵀ = A", got_residual, ref_residual, tol),
        no_worse(
          "UᵀU = I",
          residual(matmul(mT(u), u), identity_like(u)),
          residual(matmul(mT(u_ref), u_ref), identity_like(u_ref)),
          tol
        ),
        no_worse(
          "VᵀV = I",
          residual(matmul(vt, mT(vt)), identity_like(mT(vt))),
          residual(matmul(vt_ref, mT(vt_ref)), identity_like(mT(vt_ref))),
          tol
        )
      ]
    end

    defp invariants(:eigh, _opts, a, _b, {w, v}, {w_ref, v_ref}, tol) do
      eigen_residual = fn w, v -> residual(matmul(a, v), Nx.multiply(v, Nx.new_axis(w, -2))) end
      ref_residual = eigen_residual.(w_ref, v_ref)
      got_residual = eigen_residual.(w, v)
      {atol, rtol} = tol

      [
        # for a symmetric matrix, eigenvalues move by at most the residual
        close(
          "eigenvalues",
          Nx.sort(w, axis: -1),
          Nx.sort(w_ref, axis: -1),
          {atol + ref_residual + got_residual, rtol}
        ),
        no_worse("A·V = V·diag(w)", got_residual, ref_residual, tol),
        no_worse(
          "VᵀV = I",
          residual(matmul(mT(v), v), identity_like(v)),
          residual(matmul(mT(v_ref), v_ref), identity_like(v_ref)),
          tol
        )
      ]
    end

    defp invariants(:solve, _opts, a, b, x, x_ref, tol) do
      ax = if Nx.rank(x) == Nx.rank(a), do: matmul(a, x), else: Nx.dot(a, [-1], batch(a), x, [-1], batch(a))
      [close("x", x, x_ref, tol), close("A·x = b", ax, b, tol)]
    end

    defp invariants(:determinant, _opts, _a, _b, det, det_ref, tol) do
      [close("det", det, det_ref, tol), close("|det|", Nx.abs(det), Nx.abs(det_ref), tol)]
    end

    defp invariants(:cholesky, _opts, a, _b, l, l_ref, tol) do
      [close("L", l, l_ref, tol), close("L·Lᵀ = A", matmul(l, mT(l)), a, tol)]
    end

    defp invariants(op, _opts, _a, _b, res, ref, tol) when op in [:pinv, :triangular_solve] do
      [close("#{op}", res, ref, tol)]
    end

    defp strictly_lower(t) do
      {m, n} = {elem(t.shape, Nx.rank(t) - 2), elem(t.shape, Nx.rank(t) - 1)}
      Nx.greater(Nx.iota({m, n}, axis: 0), Nx.iota({m, n}, axis: 1)) |> Nx.as_type({:f, 64})
    end

    ## Compiler stats

    defp stats_delta(before, later) do
      for {key, n} <- later, n != Map.get(before, key, 0), into: %{}, do: {key, n - Map.get(before, key, 0)}
    end

    defp stats_problems(program, delta) do
      allowed = Map.get(@hosted_ok, program.kind, [])
      hosted = for {{tag, op}, _} <- delta, tag in [:hosted_op, :fallback_op], op not in allowed, do: op

      [
        if(Map.get(delta, :fallback, 0) != 0, do: "whole-graph Evaluator fallback: #{inspect(delta)}"),
        if(hosted != [], do: "unexpected host nodes #{inspect(hosted)}: #{inspect(delta)}")
      ]
      |> Enum.reject(&is_nil/1)
    end

    defp report(%{kind: :generator} = program, problems) do
      "# program #{program.index} of seed #{program.seed}\n" <> Enum.map_join(problems, "\n", &("  - " <> &1))
    end

    defp report(program, problems) do
      """
      #{ProgramGen.render(program)}\
      problems:
      #{Enum.map_join(problems, "\n", &("  - " <> &1))}
      """
    end
  end
end
