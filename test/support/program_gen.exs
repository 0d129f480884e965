# A seeded generator of small random Nx programs, for test/ex_burn/defn/generated_test.exs.
# Compiled only where Nx is present (defn expands at compile time).
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.ProgramGen.Funs do
    @moduledoc false
    # The defn-only constructs (`while`, `if`) of generated programs: their bodies are Elixir
    # closures over the generated instructions, traced like inline defn code.
    import Nx.Defn

    defn fixed_loop(x, body, opts \\ []) do
      opts = keyword!(opts, n: 1)

      {_i, x} =
        while {i = 0, x}, i < opts[:n] do
          {i + 1, body.(x)}
        end

      x
    end

    defn guarded_loop(x, body, opts \\ []) do
      opts = keyword!(opts, n: 1, limit: 0)

      {_i, x} =
        while {i = 0, x}, i < opts[:n] and Nx.sum(x) < opts[:limit] do
          {i + 1, body.(x)}
        end

      x
    end

    defn branch(pred, on_true, on_false) do
      if pred, do: on_true.(), else: on_false.()
    end
  end

  defmodule ExBurn.ProgramGen do
    @moduledoc false
    # Seeded random Nx programs for differential testing of ExBurn.Defn.Compiler against
    # Nx.Defn.Evaluator on Nx.BinaryBackend.
    #
    # A program is straight-line code in SSA form: `%{params: [id], instrs: [{id, call, args}],
    # out: ref}` where an arg is `{:"$ref", id}` or a literal (numbers, lists, keywords). `while`,
    # `if` and `grad` hold nested blocks of the same form. `render/1` prints a program as the
    # Elixir/defn code it runs; `fun/1` makes the function that is jitted.
    #
    # Programs are generated against concrete values: every instruction is evaluated on
    # Nx.BinaryBackend while it is generated (`check/3`) and kept only where the reference is
    # meaningful at those values:
    #
    #   * the reference does not raise (BinaryBackend raises for exp overflow, float division by
    #     zero, log(-inf), floor(NaN), ...: those programs would test nothing);
    #   * BinaryBackend's answer is right (`reference_wrong?/3`: tanh(±Inf) is NaN there, sign of
    #     NaN/±Inf is 1, clip lets NaN through as the bound, erf_inv is an approximation good to
    #     ~1e-8, ...);
    #   * the value is well-conditioned: each float value carries an `exact` flag (bit-identical
    #     in any IEEE implementation: +, -, *, /, sqrt, min/max, rounding, shape ops, on exact
    #     operands). An op on inexact operands is evaluated again on operands perturbed by about
    #     ten ulps, elementwise with random signs, and kept only if the result moves by well under
    #     the comparison tolerance: otherwise one-ulp differences between two correct libms (sin,
    #     exp, ...) would be amplified past it (a comparison flipping, floor jumping, cancellation).
    #
    # Nothing about ExBurn is used to generate: a program is fixed before ExBurn sees it.

    alias ExBurn.ProgramGen.Funs

    @kinds [
      elementwise: 30,
      reduction: 14,
      shape: 14,
      dot: 10,
      while: 8,
      cond: 8,
      linalg: 12,
      grad: 10
    ]

    def kinds, do: Keyword.keys(@kinds)

    ## Tolerances

    @doc "`{atol, rtol}` for float results of `type` (integers compare exactly)."
    def tol({:f, 64}), do: {1.0e-10, 1.0e-10}
    def tol(_), do: {1.0e-4, 1.0e-4}

    # relative and absolute size of a perturbation, about 10 ulps
    defp perturbation({:f, 64}), do: 1.0e-12
    defp perturbation(_), do: 1.0e-6

    ## Random helpers (the process's :rand state, seeded per program)

    defp pick(list), do: Enum.at(list, :rand.uniform(length(list)) - 1)
    defp chance(p), do: :rand.uniform() < p
    defp int(lo, hi), do: lo + :rand.uniform(hi - lo + 1) - 1

    defp weighted(pairs) do
      total = pairs |> Enum.map(&elem(&1, 1)) |> Enum.sum()
      r = :rand.uniform() * total

      Enum.reduce_while(pairs, r, fn {x, w}, r -> if r < w, do: {:halt, x}, else: {:cont, r - w} end)
      |> case do
        x when is_atom(x) -> x
        _ -> pairs |> List.last() |> elem(0)
      end
    end

    defp subset(list) do
      case Enum.filter(list, fn _ -> chance(0.5) end) do
        [] -> [pick(list)]
        some -> some
      end
    end

    ## Programs

    @doc """
    Program `index` of the run with `seed`: `%{index, seed, kind, depth, params, instrs, out,
    inputs, compare, tols, attempt}`. Reproducible from `{seed, index}` alone.

    A candidate the reference cannot run as a whole (Nx.Defn.Evaluator on BinaryBackend raises
    or returns a malformed tensor: it cannot run some graphs its eager ops run) is replaced by
    the next candidate of the same index; `attempt` counts them.
    """
    def program(seed, index) do
      Enum.reduce_while(0..19, nil, fn attempt, nil ->
        program = candidate(seed, index, attempt)
        if reference_runs?(program), do: {:halt, program}, else: {:cont, nil}
      end) || raise "generator: no program the reference runs for #{inspect({seed, index})}"
    end

    defp candidate(seed, index, attempt) do
      # an integer seed is spread over the whole state (3-tuples like {seed, index, n} collide)
      :rand.seed(:exsss, seed * 1_000_000_007 + index * 1_009 + attempt)
      Process.delete(__MODULE__)
      kind = weighted(@kinds)
      depth = int(1, 6)
      st = %{next: 0, instrs: [], pool: [], vals: %{}, params: [], inputs: []}
      {st, out, compare} = generate(kind, depth, st)

      %{
        index: index,
        seed: seed,
        attempt: attempt,
        kind: kind,
        depth: depth,
        params: Enum.reverse(st.params),
        instrs: Enum.reverse(st.instrs),
        out: out,
        inputs: Enum.reverse(st.inputs),
        compare: compare,
        # per flattened result: the float type whose tolerance applies (nil: its own type)
        tols: result_tols(out, st.vals),
        # proposal loops that ended on their fallback op
        fallbacks: Map.get(counters(), :fallback, 0)
      }
    end

    defp reference_runs?(program) do
      result = apply(Nx.Defn.jit(fun(program), compiler: Nx.Defn.Evaluator), program.inputs)

      Enum.all?(Nx.Defn.Composite.flatten_list([result]), fn t ->
        {_, bits} = t.type
        byte_size(Nx.to_binary(t)) * 8 == Nx.size(t) * bits
      end)
    rescue
      _ -> false
    end

    defp result_tols(out, vals) do
      out
      |> resolve_vals(vals)
      |> List.wrap()
      |> Enum.flat_map(fn
        v when is_tuple(v) -> Enum.flat_map(Tuple.to_list(v), &[&1])
        v -> [v]
      end)
      |> Enum.flat_map(fn %{t: t, err: err} ->
        List.duplicate(err, length(Nx.Defn.Composite.flatten_list([t])))
      end)
    end

    @doc "The function the program computes, of one argument per input."
    def fun(%{params: params} = program) do
      body = Map.take(program, [:params, :instrs, :out])

      case length(params) do
        1 -> fn a -> run(body, [a]) end
        2 -> fn a, b -> run(body, [a, b]) end
        3 -> fn a, b, c -> run(body, [a, b, c]) end
      end
    end

    defp run(%{params: params} = body, args), do: eval_block(body, Map.new(Enum.zip(params, args)))

    ## Generation state

    defp new_id(st), do: {st.next, %{st | next: st.next + 1}}

    defp add_param(st, tensor) do
      {id, st} = new_id(st)
      v = %{t: tensor, exact: true, zsign: true, err: nil}

      st = %{
        st
        | params: [id | st.params],
          inputs: [tensor | st.inputs],
          pool: st.pool ++ [id],
          vals: Map.put(st.vals, id, v)
      }

      {id, st}
    end

    # evaluates `{call, args}` on the current values; on success appends it
    defp try_instr(st, call, args) do
      {id, st2} = new_id(st)

      case check_instr(call, args, st.vals) do
        {:ok, v} ->
          {:ok, id,
           %{
             st2
             | instrs: [{id, call, args} | st2.instrs],
               pool: st2.pool ++ [id],
               vals: Map.put(st2.vals, id, v)
           }}

        :reject ->
          :reject
      end
    end

    # tries proposals until one is valid; `fallback` must always be
    defp grow(st, propose, fallback, tries \\ 16) do
      attempt =
        Enum.reduce_while(1..tries, :reject, fn _, _ ->
          {call, args} = propose.(st)

          case try_instr(st, call, args) do
            {:ok, id, st} -> {:halt, {:ok, id, st}}
            :reject -> {:cont, :reject}
          end
        end)

      case attempt do
        {:ok, id, st} ->
          {id, st}

        :reject ->
          count(:fallback)
          {call, args} = fallback.(st)

          case try_instr(st, call, args) do
            {:ok, id, st} -> {id, st}
            :reject -> raise "generator: fallback #{inspect({call, args})} rejected"
          end
      end
    end

    defp counters, do: Process.get(__MODULE__, %{})

    defp count(what), do: Process.put(__MODULE__, Map.update(counters(), what, 1, &(&1 + 1)))

    defp ref(id), do: {:"$ref", id}
    defp val(st, id), do: Map.fetch!(st.vals, id)
    defp last(st), do: List.last(st.pool)

    defp focus(st) do
      if chance(0.85), do: last(st), else: pick(st.pool)
    end

    ## Inputs

    @f32_specials [
      0.0,
      -0.0,
      :infinity,
      :neg_infinity,
      :nan,
      1.0e30,
      -1.0e30,
      1.0e-30,
      1.0e-40,
      0.5,
      2.5,
      -1.5,
      3.0e38,
      65504.0
    ]
    @f64_specials [
      0.0,
      -0.0,
      :infinity,
      :neg_infinity,
      :nan,
      1.0e300,
      -1.0e300,
      1.0e-300,
      5.0e-320,
      0.5,
      2.5,
      -1.5,
      1.0e30
    ]
    @s32_specials [0, -1, 1, 2_147_483_647, -2_147_483_648, 65_536, -65_536, 1_000_000, 46_341]

    defp scalar(type, style) do
      case {type, style} do
        {{:s, _}, :special} ->
          if chance(0.1), do: pick(@s32_specials), else: int(-10, 10)

        {{:s, _}, :small} ->
          int(-3, 3)

        {{:s, _}, :dot} ->
          int(-6, 6)

        {{:s, _}, _} ->
          int(-6, 6)

        {{:f, 64}, :special} ->
          if chance(0.15), do: pick(@f64_specials), else: moderate()

        {{:f, _}, :special} ->
          if chance(0.15), do: pick(@f32_specials), else: moderate()

        {{:f, _}, :grad} ->
          :rand.uniform() * 3 - 1.5

        {{:f, _}, :dot} ->
          if chance(0.1), do: pick([0.0, -0.0, :infinity, :neg_infinity, :nan, 1.0e-30]), else: moderate()

        {{:f, _}, _} ->
          moderate()
      end
    end

    defp moderate do
      if chance(0.5), do: int(-16, 16) / 4, else: :rand.uniform() * 10 - 5
    end

    defp input(type, shape, style) do
      n = Tuple.product(shape)
      data = for _ <- 1..n//1, do: scalar(type, style)
      data |> Nx.tensor(type: type) |> Nx.reshape(shape)
    end

    defp rand_type, do: pick([{:f, 32}, {:f, 32}, {:f, 64}, {:s, 32}])
    defp rand_shape(max_rank), do: List.to_tuple(for _ <- 1..int(0, max_rank)//1, do: int(1, 4))

    defp rand_shape(min_rank, max_rank),
      do: List.to_tuple(for _ <- 1..int(min_rank, max_rank)//1, do: int(1, 4))

    # a shape that broadcasts with `shape`: some axes 1, some leading axes dropped
    defp broadcastable(shape) do
      dims = Tuple.to_list(shape)
      drop = if chance(0.25), do: int(0, length(dims)), else: 0

      dims
      |> Enum.drop(drop)
      |> Enum.map(fn d -> if chance(0.25), do: 1, else: d end)
      |> List.to_tuple()
    end

    ## Element-wise proposals

    @float_unary ~w(negate abs exp expm1 log log1p sqrt rsqrt cbrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh sigmoid erf erfc erf_inv floor ceil round sign is_nan is_infinity)a
    @int_unary ~w(negate abs sign bitwise_not)a
    @any_binary ~w(add subtract multiply max min)a
    @float_binary ~w(divide pow atan2 remainder)a
    @int_binary ~w(quotient remainder bitwise_and bitwise_or bitwise_xor left_shift right_shift pow divide)a
    @compare ~w(less less_equal greater greater_equal equal not_equal)a

    defp int_type?(type), do: Nx.Type.integer?(type)

    defp int_literal, do: pick([-3, -2, -1, 1, 2, 3, 5, 7])
    defp float_literal, do: pick([0.5, -1.5, 2.0, 3.25, -0.75, 1.0e-3, 10.0, 0.1])

    # one element-wise op on `id` (and maybe a partner from the pool or a literal)
    defp propose_elementwise(st, id, opts) do
      a = val(st, id)
      int? = int_type?(a.t.type)
      pool = if opts[:literals_only], do: [id], else: st.pool
      r = :rand.uniform()
      u8s = Enum.filter(pool, &(val(st, &1).t.type == {:u, 8}))

      cond do
        r < 0.33 ->
          op =
            cond do
              not int? -> pick(@float_unary)
              chance(0.75) -> pick(@int_unary)
              true -> pick([:sin, :exp, :sqrt, :tanh, :log1p, :sigmoid])
            end

          {{:nx, op}, [ref(id)]}

        r < 0.8 or (r < 0.86 and u8s == []) ->
          partner = if chance(0.5) and !opts[:literals_only], do: ref(pick(pool)), else: nil
          partner_int? = match?({:"$ref", _}, partner) and int_type?(val(st, elem(partner, 1)).t.type)
          both_int? = int? and (partner == nil or partner_int?)

          op =
            if both_int?,
              do: pick(@any_binary ++ @int_binary ++ @compare),
              else: pick(@any_binary ++ @float_binary ++ @compare)

          partner =
            cond do
              partner != nil ->
                partner

              op in [:left_shift, :right_shift] ->
                if(chance(0.8), do: int(0, 5), else: pick([31, 32, 33, 40]))

              op == :pow ->
                pick([2, 3, 0.5, -1, 2.0, -2.0])

              int? and chance(0.7) ->
                int_literal()

              true ->
                float_literal()
            end

          if chance(0.2), do: {{:nx, op}, [partner, ref(id)]}, else: {{:nx, op}, [ref(id), partner]}

        r < 0.86 ->
          other = if chance(0.5), do: ref(pick(pool)), else: pick([0, 1.5, -2])
          {{:nx, :select}, [ref(pick(u8s)), ref(id), other]}

        r < 0.94 ->
          {{:nx, :as_type}, [ref(id), pick([{:s, 32}, {:f, 32}, {:f, 64}] -- [a.t.type])]}

        true ->
          {lo, hi} = if int?, do: pick([{-2, 3}, {0, 5}]), else: pick([{-1.0, 1.0}, {0, 5}, {-2.5, 0.5}])
          {{:nx, :clip}, [ref(id), lo, hi]}
      end
    end

    defp fallback_elementwise(id), do: fn _st -> {{:nx, :add}, [ref(id), ref(id)]} end

    defp elementwise_step(st, opts \\ []) do
      id = if opts[:literals_only], do: last(st), else: focus(st)
      grow(st, &propose_elementwise(&1, id, opts), fallback_elementwise(id))
    end

    ## Reductions

    defp propose_reduction(st, id) do
      t = val(st, id).t
      rank = Nx.rank(t)

      case pick([
             :sum,
             :product,
             :mean,
             :reduce_max,
             :reduce_min,
             :argmax,
             :argmin,
             :sort,
             :argsort,
             :cumulative_sum
           ]) do
        op when op in [:sort, :argsort] and rank > 0 ->
          stable = if op == :argsort, do: [stable: true], else: []
          {{:nx, op}, [ref(id), [axis: int(0, rank - 1), direction: pick([:asc, :desc])] ++ stable]}

        :cumulative_sum when rank > 0 ->
          {{:nx, :cumulative_sum}, [ref(id), [axis: int(0, rank - 1), reverse: chance(0.3)]]}

        op when op in [:sort, :argsort, :cumulative_sum] ->
          {{:nx, :sum}, [ref(id), []]}

        op when op in [:argmax, :argmin] ->
          axis = if rank > 0 and chance(0.8), do: [axis: int(0, rank - 1)], else: []
          {{:nx, op}, [ref(id), axis ++ [keep_axis: chance(0.3), tie_break: pick([:low, :high])]]}

        op ->
          axes = if rank > 0 and chance(0.7), do: [axes: subset(Enum.to_list(0..(rank - 1)))], else: []
          {{:nx, op}, [ref(id), axes ++ [keep_axes: chance(0.3)]]}
      end
    end

    defp reduction_step(st) do
      id = last(st)
      grow(st, &propose_reduction(&1, id), fn _ -> {{:nx, :reduce_max}, [ref(id), []]} end)
    end

    ## Shape ops

    defp factor_shape(size) do
      # split size into factors, sometimes with unit axes
      factors = prime_factors(size, 2)

      groups =
        Enum.reduce(factors, [], fn f, acc ->
          if acc != [] and chance(0.5), do: [hd(acc) * f | tl(acc)], else: [f | acc]
        end)

      groups = if chance(0.3), do: List.insert_at(groups, int(0, length(groups)), 1), else: groups
      groups |> Enum.shuffle() |> List.to_tuple()
    end

    defp prime_factors(1, _), do: []
    defp prime_factors(n, p) when rem(n, p) == 0, do: [p | prime_factors(div(n, p), p)]
    defp prime_factors(n, p), do: prime_factors(n, p + 1)

    defp propose_shape(st, id) do
      t = val(st, id).t
      shape = t.shape
      rank = tuple_size(shape)
      dims = Tuple.to_list(shape)
      axes = Enum.to_list(0..(rank - 1)//1)
      same_shape = Enum.filter(st.pool, &(val(st, &1).t.shape == shape and val(st, &1).t.type == t.type))

      case pick([
             :reshape,
             :transpose,
             :slice,
             :concatenate,
             :pad,
             :reverse,
             :squeeze,
             :broadcast,
             :stack,
             :put_slice
           ]) do
        :reshape ->
          {{:nx, :reshape}, [ref(id), factor_shape(Nx.size(t))]}

        :transpose when rank >= 2 ->
          {{:nx, :transpose}, [ref(id), [axes: Enum.shuffle(axes)]]}

        :slice when rank >= 1 ->
          lengths = Enum.map(dims, &int(1, &1))
          starts = Enum.zip_with(dims, lengths, fn d, l -> int(0, d - l) end)
          strides = if chance(0.3), do: [strides: Enum.map(dims, fn _ -> int(1, 2) end)], else: []
          {{:nx, :slice}, [ref(id), starts, lengths] ++ if(strides == [], do: [], else: [strides])}

        :concatenate when rank >= 1 ->
          {{:nx, :concatenate}, [[ref(id), ref(pick(same_shape))], [axis: pick(axes)]]}

        :stack ->
          {{:nx, :stack}, [[ref(pick(same_shape)), ref(id)], [axis: int(0, rank)]]}

        :pad ->
          config = Enum.map(dims, fn _ -> {int(-1, 2), int(-1, 2), int(0, 1)} end)
          value = if int_type?(t.type), do: pick([0, -1, 7]), else: pick([0.0, -1.5, 2.0])
          {{:nx, :pad}, [ref(id), value, config]}

        :reverse when rank >= 1 ->
          {{:nx, :reverse}, [ref(id), [axes: subset(axes)]]}

        :squeeze ->
          case Enum.filter(axes, &(elem(shape, &1) == 1)) do
            [] -> {{:nx, :new_axis}, [ref(id), int(0, rank)]}
            ones -> {{:nx, :squeeze}, [ref(id), [axes: subset(ones)]]}
          end

        :broadcast ->
          bigger = dims |> Enum.map(fn d -> if d == 1 and chance(0.5), do: int(2, 3), else: d end)
          bigger = if chance(0.5) or bigger == dims, do: [int(2, 3) | bigger], else: bigger
          {{:nx, :broadcast}, [ref(id), List.to_tuple(bigger)]}

        :put_slice when rank >= 1 ->
          fits =
            Enum.filter(st.pool, fn p ->
              s = val(st, p).t.shape
              tuple_size(s) == rank and Enum.all?(Enum.zip(Tuple.to_list(s), dims), fn {a, b} -> a <= b end)
            end)

          starts = Enum.map(dims, &int(0, &1))
          {{:nx, :put_slice}, [ref(id), starts, ref(pick(fits))]}

        _ ->
          {{:nx, :reverse}, [ref(id), []]}
      end
    end

    defp shape_step(st) do
      id = last(st)
      grow(st, &propose_shape(&1, id), fn _ -> {{:nx, :reverse}, [ref(id), []]} end)
    end

    ## Kinds

    defp generate(:elementwise, depth, st) do
      full = rand_shape(3)

      st =
        Enum.reduce(1..int(1, 3), st, fn i, st ->
          shape = if i == 1, do: full, else: broadcastable(full)
          type = rand_type()
          {_, st} = add_param(st, input(type, shape, :special))
          st
        end)

      st = Enum.reduce(1..depth, st, fn _, st -> elem(elementwise_step(st), 1) end)
      {st, output(st), :close}
    end

    defp generate(:reduction, depth, st) do
      type = rand_type()
      {_, st} = add_param(st, input(type, rand_shape(1, 3), pick([:special, :moderate, :small])))
      must = int(1, depth)

      st =
        Enum.reduce(1..depth, st, fn i, st ->
          t = val(st, last(st)).t

          if (i == must or chance(0.5)) and Nx.rank(t) > 0,
            do: elem(reduction_step(st), 1),
            else: elem(elementwise_step(st), 1)
        end)

      {st, output(st), :close}
    end

    defp generate(:shape, depth, st) do
      shape = rand_shape(1, 3)
      type = rand_type()
      {_, st} = add_param(st, input(type, shape, :special))
      st = if chance(0.4), do: elem(add_param(st, input(type, shape, :special)), 1), else: st

      st =
        Enum.reduce(1..depth, st, fn _, st ->
          if chance(0.2), do: elem(elementwise_step(st), 1), else: elem(shape_step(st), 1)
        end)

      {st, output(st), :close}
    end

    defp generate(:dot, depth, st) do
      {shape_a, shape_b, axes} = dot_shapes()
      {type_a, type_b} = {rand_type(), rand_type()}

      # inputs with special values (NaN, ±Inf, ±0) where BinaryBackend's dot takes them, else
      # without
      st =
        Enum.reduce_while([pick([:dot, :moderate]), :dot, :moderate], nil, fn style, nil ->
          {a, st} = add_param(st, input(type_a, shape_a, style))
          {b, st} = add_param(st, input(type_b, shape_b, style))

          args =
            case axes do
              [] -> [ref(a), ref(b)]
              [ca, cb] -> [ref(a), ca, ref(b), cb]
              [ca, ba, cb, bb] -> [ref(a), ca, ba, ref(b), cb, bb]
            end

          case try_instr(st, {:nx, :dot}, args) do
            {:ok, _, st} -> {:halt, st}
            :reject when style == :moderate -> raise "generator: dot rejected #{inspect(args)}"
            :reject -> {:cont, nil}
          end
        end)

      st =
        Enum.reduce(2..depth//1, st, fn _, st ->
          if chance(0.3) and Nx.rank(val(st, last(st)).t) > 0,
            do: elem(reduction_step(st), 1),
            else: elem(elementwise_step(st), 1)
        end)

      {st, output(st), :close}
    end

    defp generate(:while, depth, st) do
      type = rand_type()
      {_, st} = add_param(st, input(type, rand_shape(2), if(int_type?(type), do: :small, else: :moderate)))
      st = if chance(0.3), do: elem(elementwise_step(st), 1), else: st
      init = last(st)
      st = loop_instr(st, init, depth)
      st = if chance(0.3), do: elem(elementwise_step(st), 1), else: st
      {st, output(st), :close}
    end

    defp generate(:cond, depth, st) do
      full = rand_shape(2)

      st =
        Enum.reduce(1..int(1, 2), st, fn i, st ->
          shape = if i == 1, do: full, else: broadcastable(full)
          {_, st} = add_param(st, input(rand_type(), shape, pick([:special, :moderate])))
          st
        end)

      st = cond_instr(st, depth)
      st = if chance(0.3), do: elem(elementwise_step(st), 1), else: st
      {st, output(st), :close}
    end

    defp generate(:grad, depth, st), do: grad_program(depth, st)
    defp generate(:linalg, _depth, st), do: linalg_program(st)

    # the last value, sometimes with another one (container results)
    defp output(st) do
      if chance(0.2) and length(st.pool) > 1,
        do: {:tuple, [ref(last(st)), ref(pick(st.pool))]},
        else: ref(last(st))
    end

    ## dot shapes: {shape_a, shape_b, contraction/batch args}

    defp dot_shapes do
      case pick([:dot2, :dot2, :dot4, :dot6]) do
        :dot2 ->
          {m, n, p} = {int(1, 4), int(1, 4), int(1, 4)}

          {sa, sb} =
            pick([{{n}, {n}}, {{m, n}, {n}}, {{n}, {n, p}}, {{m, n}, {n, p}}, {{}, {m, n}}, {{m, n}, {}}])

          {sa, sb, []}

        :dot4 ->
          {sa, sb, ca, cb} = contraction(0)
          {sa, sb, [ca, cb]}

        :dot6 ->
          batch = for _ <- 1..int(1, 2), do: int(1, 3)
          {sa, sb, ca, cb} = contraction(length(batch))
          axes = Enum.to_list(0..(length(batch) - 1))

          {List.to_tuple(batch ++ Tuple.to_list(sa)), List.to_tuple(batch ++ Tuple.to_list(sb)),
           [ca, axes, cb, axes]}
      end
    end

    # contracted and free axes in random order; axes offset by the batch axes in front
    defp contraction(offset) do
      k = for _ <- 1..int(1, 2), do: int(1, 4)
      free_a = for _ <- 1..int(0, 2)//1, do: int(1, 3)
      free_b = for _ <- 1..int(0, 2)//1, do: int(1, 3)
      {sa, ca} = place(k, free_a, offset)
      {sb, cb} = place(k, free_b, offset)
      {sa, sb, ca, cb}
    end

    defp place(k, free, offset) do
      tagged = Enum.shuffle(Enum.with_index(k, fn d, i -> {:k, i, d} end) ++ Enum.map(free, &{:free, 0, &1}))
      shape = tagged |> Enum.map(&elem(&1, 2)) |> List.to_tuple()

      axes =
        tagged
        |> Enum.with_index()
        |> Enum.filter(fn {{tag, _, _}, _} -> tag == :k end)
        |> Enum.sort_by(fn {{_, i, _}, _} -> i end)
        |> Enum.map(fn {_, pos} -> pos + offset end)

      {shape, axes}
    end

    ## while

    defp loop_instr(st, init, depth) do
      state = val(st, init)
      n = int(1, 5)
      guarded? = int_type?(state.t.type) and chance(0.5)

      attempt =
        Enum.reduce_while(1..8, :reject, fn _, _ ->
          {block, st2} = loop_body(st, init, depth)

          call =
            if guarded?,
              do: {:guarded_while, n, int(-5, 40), block},
              else: {:while, n, block}

          case try_instr(st2, call, [ref(init)]) do
            {:ok, _id, st3} -> {:halt, {:ok, st3}}
            :reject -> {:cont, :reject}
          end
        end)

      case attempt do
        {:ok, st} ->
          st

        :reject ->
          {param, st2} = new_id(st)
          {body_id, st2} = new_id(st2)
          block = %{params: [param], instrs: [{body_id, {:nx, :add}, [ref(param), 1]}], out: ref(body_id)}
          {:ok, _, st3} = try_instr(st2, {:while, n, block}, [ref(init)])
          st3
      end
    end

    # a body over the loop state only (and literals), cast back to the state's type
    defp loop_body(st, init, depth) do
      state = val(st, init)
      {param, st} = new_id(st)
      inner = %{st | instrs: [], pool: [param], vals: Map.put(st.vals, param, state)}

      inner =
        Enum.reduce(1..depth, inner, fn _, inner ->
          if chance(0.15) and depth > 1,
            do: nested_cond(inner),
            else: elem(elementwise_step(inner, literals_only: true), 1)
        end)

      out = val(inner, last(inner)).t

      inner =
        cond do
          out.type != state.t.type ->
            elem(
              grow(
                inner,
                fn s -> {{:nx, :as_type}, [ref(last(s)), state.t.type]} end,
                fn _ -> {{:nx, :multiply}, [ref(param), 2]} end,
                1
              ),
              1
            )

          true ->
            inner
        end

      inner =
        if val(inner, last(inner)).t.shape != state.t.shape,
          do:
            elem(
              grow(
                inner,
                fn s -> {{:nx, :broadcast}, [ref(last(s)), state.t.shape]} end,
                fn _ -> {{:nx, :negate}, [ref(param)]} end,
                1
              ),
              1
            ),
          else: inner

      block = %{params: [param], instrs: Enum.reverse(inner.instrs), out: ref(last(inner))}
      {block, %{st | next: inner.next, vals: inner.vals}}
    end

    # an `if` on a predicate of the latest value, with short element-wise branches
    defp nested_cond(st) do
      cond_instr(st, 2, literals_only: true)
    end

    ## cond

    defp cond_instr(st, depth, opts \\ []) do
      subject = last(st)
      {pred, st} = predicate(st, subject)
      t_depth = int(1, max(depth, 1))
      f_depth = int(1, max(depth, 1))
      {tb, st} = branch_block(st, subject, t_depth, opts)
      {fb, st} = branch_block(st, subject, f_depth, opts)
      {tb, fb, st} = unify_branches(tb, fb, st)

      case try_instr(st, {:cond, tb, fb}, [ref(pred)]) do
        {:ok, _id, st} -> st
        :reject -> elem(elementwise_step(st, opts), 1)
      end
    end

    # a scalar u8: a reduction of `id` compared with a threshold near its value
    defp predicate(st, id) do
      propose = fn _st ->
        op = pick([:sum, :reduce_max, :reduce_min, :mean])
        {{:nx, op}, [ref(id), []]}
      end

      {r, st} = grow(st, propose, fn _ -> {{:nx, :reduce_max}, [ref(id), []]} end)
      v = val(st, r).t |> Nx.as_type({:f, 64}) |> Nx.to_number()
      v = if is_number(v), do: v, else: 0.0
      threshold = Float.round(v + pick([-1, 1]) * (0.25 + :rand.uniform()), 2)
      cmp = pick([:greater, :less, :greater_equal, :less_equal])

      grow(st, fn _ -> {{:nx, cmp}, [ref(r), threshold]} end, fn _ -> {{:nx, :is_nan}, [ref(r)]} end, 1)
    end

    defp branch_block(st, subject, depth, opts) do
      inner = %{st | instrs: [], pool: if(opts[:literals_only], do: [subject], else: st.pool ++ [subject])}

      inner =
        Enum.reduce(1..depth, inner, fn _, inner ->
          if chance(0.15) and !opts[:literals_only] and Nx.rank(val(inner, last(inner)).t) > 0,
            do: elem(reduction_step(inner), 1),
            else: elem(elementwise_step(inner, opts), 1)
        end)

      block = %{params: [], instrs: Enum.reverse(inner.instrs), out: ref(last(inner))}
      {block, %{st | next: inner.next, vals: inner.vals}}
    end

    # both branches end in the same type and shape
    defp unify_branches(tb, fb, st) do
      {tb, fb, st} =
        if broadcast_shape(out_t(tb, st).shape, out_t(fb, st).shape) == nil do
          {tb, st} = append(tb, {:nx, :reduce_max}, [], st)
          {fb, st} = append(fb, {:nx, :reduce_max}, [], st)
          {tb, fb, st}
        else
          {tb, fb, st}
        end

      {tt, ft} = {out_t(tb, st), out_t(fb, st)}
      type = Nx.Type.merge(tt.type, ft.type)
      shape = broadcast_shape(tt.shape, ft.shape)
      {tb, st} = coerce(tb, tt, type, shape, st)
      {fb, st} = coerce(fb, ft, type, shape, st)
      {tb, fb, st}
    end

    defp out_t(%{out: {:"$ref", id}}, st), do: val(st, id).t

    defp broadcast_shape(a, b) do
      {a, b} = {Tuple.to_list(a), Tuple.to_list(b)}
      n = max(length(a), length(b))
      pad = fn l -> List.duplicate(1, n - length(l)) ++ l end

      Enum.zip(pad.(a), pad.(b))
      |> Enum.reduce_while([], fn
        {x, x}, acc -> {:cont, [x | acc]}
        {1, y}, acc -> {:cont, [y | acc]}
        {x, 1}, acc -> {:cont, [x | acc]}
        _, _ -> {:halt, nil}
      end)
      |> case do
        nil -> nil
        dims -> dims |> Enum.reverse() |> List.to_tuple()
      end
    end

    defp coerce(block, t, type, shape, st) do
      {block, st} = if t.type != type, do: append(block, {:nx, :as_type}, type, st), else: {block, st}

      if t.shape != shape, do: append(block, {:nx, :broadcast}, shape, st), else: {block, st}
    end

    defp append(%{out: out} = block, call, arg, st) do
      {id, st} = new_id(st)
      args = [out, arg]

      # casts only widen (Nx.Type.merge) and broadcasts only grow: always valid
      case check_instr(call, args, st.vals) do
        {:ok, v} ->
          {%{block | instrs: block.instrs ++ [{id, call, args}], out: ref(id)},
           %{st | vals: Map.put(st.vals, id, v)}}

        :reject ->
          raise "generator: #{inspect(call)} of a branch result rejected"
      end
    end

    ## grad

    @grad_unary ~w(sin cos tanh sigmoid exp atan erf negate)a
    @grad_binary ~w(add subtract multiply divide pow max min)a

    defp grad_program(depth, st) do
      type = pick([{:f, 32}, {:f, 64}])
      shape = rand_shape(2)
      {x, st} = add_param(st, input(type, shape, :grad))

      {_w, st} =
        if chance(0.5),
          do: add_param(st, input(pick([type, {:f, 32}, {:s, 32}]), broadcastable(shape), :grad)),
          else: {nil, st}

      mode = if chance(0.3), do: :value_and_grad, else: :grad

      attempt =
        Enum.reduce_while(1..8, :reject, fn _, _ ->
          {block, st2} = grad_body(st, x, depth)

          case try_instr(st2, {:grad, mode, block}, [ref(x)]) do
            {:ok, _id, st3} -> {:halt, {:ok, st3}}
            :reject -> {:cont, :reject}
          end
        end)

      st =
        case attempt do
          {:ok, st} ->
            st

          :reject ->
            {param, st2} = new_id(st)
            {s, st2} = new_id(st2)
            block = %{params: [param], instrs: [{s, {:nx, :sum}, [ref(param), []]}], out: ref(s)}
            {:ok, _, st3} = try_instr(st2, {:grad, mode, block}, [ref(x)])
            st3
        end

      {st, ref(last(st)), :close}
    end

    defp grad_body(st, x, depth) do
      {param, st} = new_id(st)
      inner = %{st | instrs: [], pool: tl(st.pool) ++ [param], vals: Map.put(st.vals, param, val(st, x))}

      inner =
        Enum.reduce(1..depth, inner, fn _, inner ->
          id = focus(inner)
          grow(inner, &propose_grad(&1, id), fallback_elementwise(id)) |> elem(1)
        end)

      inner =
        if Nx.rank(val(inner, last(inner)).t) > 0 do
          op = pick([:sum, :sum, :mean, :reduce_max, :product])

          {_, inner} =
            grow(inner, fn s -> {{:nx, op}, [ref(last(s)), []]} end, fn s ->
              {{:nx, :sum}, [ref(last(s)), []]}
            end)

          inner
        else
          inner
        end

      block = %{params: [param], instrs: Enum.reverse(inner.instrs), out: ref(last(inner))}
      {block, %{st | next: inner.next, vals: inner.vals}}
    end

    defp propose_grad(st, id) do
      a = val(st, id)

      case :rand.uniform(10) do
        n when n <= 4 ->
          {{:nx, pick(@grad_unary)}, [ref(id)]}

        n when n <= 8 ->
          op = pick(@grad_binary)

          partner =
            cond do
              op == :pow -> pick([2, 3])
              op == :divide -> pick([2.0, -3.0, 0.5])
              chance(0.6) -> ref(pick(st.pool))
              true -> float_literal()
            end

          {{:nx, op}, [ref(id), partner]}

        9 ->
          rank = Nx.rank(a.t)
          axes = if rank > 0, do: [axes: [int(0, rank - 1)]], else: []
          {{:nx, pick([:sum, :mean])}, [ref(id), axes]}

        10 ->
          partner = pick(st.pool)
          {{:nx, :dot}, [ref(id), ref(partner)]}
      end
    end

    ## LinAlg

    defp linalg_program(st) do
      Enum.reduce_while(1..10, nil, fn _, nil ->
        case linalg_attempt(st) do
          {:ok, result} -> {:halt, result}
          :reject -> {:cont, nil}
        end
      end) || raise "generator: no valid LinAlg program"
    end

    defp linalg_attempt(st) do
      op = pick([:qr, :svd, :eigh, :cholesky, :solve, :determinant, :pinv, :triangular_solve])
      type = pick([{:f, 32}, {:f, 64}])
      n = int(1, 5)
      batch = if chance(0.3), do: [int(1, 3)], else: []
      in_graph? = op in [:cholesky, :eigh, :solve, :determinant] and chance(0.4)
      det_type = if chance(0.2) and not in_graph?, do: {:s, 32}, else: type

      {st, a, extra_args, opts} =
        case op do
          op when op in [:qr, :svd, :pinv] ->
            m = if chance(0.5), do: n, else: int(1, 5)
            {mat, st} = add_param(st, matrix(:rect, batch, m, n, type))

            opts =
              case op do
                :qr -> [[mode: pick([:reduced, :complete])]]
                :svd -> [[full_matrices?: chance(0.5)]]
                :pinv -> []
              end

            {st, mat, [], opts}

          :triangular_solve ->
            lower? = chance(0.5)
            {mat, st} = add_param(st, matrix(if(lower?, do: :lower, else: :upper), batch, n, n, type))
            left? = chance(0.7)
            k = int(1, 3)
            b_shape = if left?, do: batch ++ if(chance(0.5), do: [n], else: [n, k]), else: batch ++ [k, n]
            {b, st} = add_param(st, input(pick([type, {:f, 32}]), List.to_tuple(b_shape), :moderate))
            opts = [[lower: lower?, left_side: left?, transform_a: pick([:none, :transpose])]]
            {st, mat, [ref(b)], opts}

          :solve ->
            {mat, st} = square(st, in_graph?, :general, batch, n, type)
            k = int(1, 3)
            b_shape = batch ++ if(chance(0.5), do: [n], else: [n, k])
            {b, st} = add_param(st, input(pick([type, {:s, 32}]), List.to_tuple(b_shape), :moderate))
            {st, mat, [ref(b)], []}

          :cholesky ->
            {mat, st} = square(st, in_graph?, :spd, batch, n, type)
            {st, mat, [], []}

          :eigh ->
            {mat, st} = square(st, in_graph?, :symmetric, batch, n, type)
            {st, mat, [], []}

          :determinant ->
            {mat, st} = square(st, in_graph?, :general, batch, n, det_type)
            {st, mat, [], []}
        end

      args = [ref(a)] ++ extra_args ++ opts

      case try_instr(st, {:linalg, op}, args) do
        {:ok, res, st} -> {:ok, {st, {:tuple, [ref(a) | extra_args] ++ [ref(res)]}, {:linalg, op, opts}}}
        :reject -> :reject
      end
    end

    # a square matrix: an input, or built in the program from an input (M·Mᵀ + n·I, ...)
    defp square(st, false, structure, batch, n, type), do: add_param(st, matrix(structure, batch, n, n, type))

    defp square(st, true, structure, batch, n, type) do
      {m, st} = add_param(st, input(type, List.to_tuple(batch ++ [n, n]), :moderate))
      axes = Enum.to_list(0..(length(batch) - 1)//1)
      eye = Nx.eye(n, type: type) |> Nx.multiply(4.0 * n + 4) |> Nx.to_flat_list()

      build =
        case structure do
          :spd ->
            [{{:nx, :dot}, fn m -> [ref(m), [-1], axes, ref(m), [-1], axes] end}]

          :symmetric ->
            [
              {{:nx, :transpose}, fn m -> [ref(m), [axes: last_two(Nx.shape(val(st, m).t))]] end},
              {{:nx, :add}, fn t -> [ref(t), ref(m)] end}
            ]

          :general ->
            [{{:nx, :multiply}, fn m -> [ref(m), 0.25] end}]
        end

      {id, st} =
        Enum.reduce(build, {m, st}, fn {call, args}, {prev, st} ->
          {:ok, id, st} = try_instr(st, call, args.(prev))
          {id, st}
        end)

      # plus a dominant diagonal
      diag = Nx.tensor(eye, type: type) |> Nx.reshape({n, n})
      {:ok, id, st} = try_instr(st, {:nx, :add}, [ref(id), {:"$const", diag}])
      {id, st}
    end

    # a well-conditioned matrix on the host (an exact input)
    defp matrix(structure, batch, m, n, type) do
      shape = List.to_tuple(batch ++ [m, n])
      r = input({:f, 64}, shape, :moderate) |> Nx.divide(4)
      k = max(m, n)
      eye = Nx.eye({m, n}, type: {:f, 64}) |> Nx.broadcast(shape)
      signs = Nx.tensor(for(_ <- 1..min(m, n), do: pick([-1.0, 1.0])), type: {:f, 64})
      dominant = Nx.multiply(eye, Nx.multiply(k + 1.0, Nx.pad(signs, 1.0, [{0, n - min(m, n), 0}])))

      case structure do
        :rect ->
          Nx.add(r, dominant)

        :general ->
          Nx.add(r, dominant)

        :lower ->
          Nx.add(tril(r), Nx.abs(dominant))

        :upper ->
          Nx.add(
            Nx.transpose(tril(Nx.transpose(r, axes: last_two(shape))), axes: last_two(shape)),
            Nx.abs(dominant)
          )

        :spd ->
          r
          |> then(&Nx.dot(&1, [-1], batch_axes(batch), &1, [-1], batch_axes(batch)))
          |> Nx.add(Nx.abs(dominant))

        :symmetric ->
          r |> Nx.add(Nx.transpose(r, axes: last_two(shape))) |> Nx.add(Nx.multiply(eye, spread(n)))
      end
      |> Nx.as_type(type)
    end

    defp tril(t) do
      {m, n} = {elem(t.shape, tuple_size(t.shape) - 2), elem(t.shape, tuple_size(t.shape) - 1)}
      mask = Nx.greater_equal(Nx.iota({m, n}, axis: 0), Nx.iota({m, n}, axis: 1))
      Nx.select(Nx.broadcast(mask, t.shape), t, 0.0)
    end

    defp last_two(shape) do
      r = tuple_size(shape)
      Enum.to_list(0..(r - 3)//1) ++ [r - 1, r - 2]
    end

    defp batch_axes(batch), do: Enum.to_list(0..(length(batch) - 1)//1)

    # distinct, well separated eigenvalues
    defp spread(n), do: Nx.tensor(Enum.map(1..n, &(3.0 * &1)), type: {:f, 64})

    ## Checking (generation on BinaryBackend values)

    # `{:ok, %{t: tensor, exact: bool, zsign: bool}}` or `:reject`
    defp check_instr(call, args, vals) do
      case call do
        {kind, _} when kind in [:nx, :linalg] ->
          check_apply(call, resolve_vals(args, vals))

        {:while, n, block} ->
          [init] = resolve_vals(args, vals)
          check_loop(block, init, n, nil, vals)

        {:guarded_while, n, limit, block} ->
          [init] = resolve_vals(args, vals)
          check_loop(block, init, n, limit, vals)

        {:cond, tb, fb} ->
          [pred] = resolve_vals(args, vals)

          if pred.t |> Nx.to_number() != 0,
            do: check_block(tb, [], vals),
            else: check_block(fb, [], vals)

        {:grad, mode, block} ->
          [x] = resolve_vals(args, vals)

          with {:ok, value} <- check_block(block, [x], vals),
               {:ok, result} <- attempt(fn -> reference_grad(mode, block, x.t, vals) end) do
            err = least_precise([x.t.type, value.err || value.t.type])
            {:ok, %{t: result, exact: false, zsign: false, err: err}}
          else
            _ -> :reject
          end
      end
    end

    defp check_block(%{params: params, instrs: instrs, out: out}, args, vals) do
      vals = Map.merge(vals, Map.new(Enum.zip(params, args)))

      Enum.reduce_while(instrs, {:ok, vals}, fn {id, call, args}, {:ok, vals} ->
        case check_instr(call, args, vals) do
          {:ok, v} -> {:cont, {:ok, Map.put(vals, id, v)}}
          :reject -> {:halt, :reject}
        end
      end)
      |> case do
        {:ok, vals} -> {:ok, resolve_vals(out, vals)}
        :reject -> :reject
      end
    end

    defp check_loop(block, init, n, limit, vals) do
      Enum.reduce_while(1..n, {:ok, init}, fn _, {:ok, state} ->
        continue? = limit == nil or Nx.to_number(Nx.sum(state.t)) < limit

        if continue? do
          case check_block(block, [state], vals) do
            {:ok, next} -> {:cont, {:ok, next}}
            :reject -> {:halt, :reject}
          end
        else
          {:halt, {:ok, state}}
        end
      end)
    end

    defp reference_grad(mode, block, x, vals) do
      fun = fn x ->
        env = Map.new(vals, fn {id, v} -> {id, v.t} end)
        eval_call({:grad, mode, block}, [x], env)
      end

      Nx.Defn.jit(fun, compiler: Nx.Defn.Evaluator).(x)
    end

    defp resolve_vals({:"$ref", id}, vals), do: Map.fetch!(vals, id)
    defp resolve_vals({:tuple, refs}, vals), do: refs |> Enum.map(&resolve_vals(&1, vals)) |> List.to_tuple()
    defp resolve_vals({:"$const", t}, _vals), do: %{t: t, exact: true, zsign: true, err: nil}
    defp resolve_vals(list, vals) when is_list(list), do: Enum.map(list, &resolve_vals(&1, vals))
    defp resolve_vals(other, _vals), do: other

    defp plain(%{t: t}), do: t
    defp plain(list) when is_list(list), do: Enum.map(list, &plain/1)
    defp plain(other), do: other

    defp tensor_vals(args), do: args |> List.flatten() |> Enum.filter(&match?(%{t: _}, &1))

    defp attempt(fun) do
      {:ok, fun.()}
    rescue
      _ -> :reject
    end

    defp check_apply(call, args) do
      vals = tensor_vals(args)

      with false <- too_costly?(call, args),
           {:ok, out} <- attempt(fn -> apply_call(call, plain(args)) end),
           false <- reference_wrong?(call, args, out),
           exact = exact?(call, vals, out),
           err = if(exact, do: nil, else: err_type(vals, out)),
           true <- match?({:linalg, _}, call) or stable?(call, args, out, err) do
        {:ok, %{t: out, exact: exact, zsign: zsign?(call, vals), err: err}}
      else
        _ -> :reject
      end
    end

    # BinaryBackend computes integer pow and shifts with bignums: 65536 ** 2147483647 or
    # 1 <<< 2147483647 would run (uninterruptibly) for minutes
    defp too_costly?({:nx, f}, [_, b]) when f in [:pow, :left_shift, :right_shift] do
      case b do
        %{t: t} -> int_type?(t.type) and max_abs(t) > 64
        n when is_integer(n) -> abs(n) > 64
        _ -> false
      end
    end

    defp too_costly?(_call, _args), do: false

    # The precision an inexact value has: that of the least precise float type it went
    # through (an f32 sine added to an f64 is good to f32's digits).
    defp err_type(vals, out) do
      out_types =
        for %Nx.Tensor{type: type} <- List.wrap(if(is_tuple(out), do: Tuple.to_list(out), else: out)),
            do: type

      least_precise(out_types ++ for(v <- vals, v.err != nil, do: v.err))
    end

    @doc false
    def least_precise(types) do
      if Enum.any?(types, &(Nx.Type.float?(&1) and &1 != {:f, 64})), do: {:f, 32}, else: {:f, 64}
    end

    defp apply_call({:nx, f}, args), do: apply(Nx, f, args)
    defp apply_call({:linalg, f}, args), do: apply(Nx.LinAlg, f, args)

    # ops whose float results are bit-identical in any IEEE implementation
    @rounded ~w(add subtract multiply divide negate abs max min sqrt floor ceil round clip select as_type remainder reshape transpose slice concatenate pad reverse squeeze broadcast new_axis stack put_slice reduce_max reduce_min sort)a
    @shape_ops ~w(negate reshape transpose slice concatenate pad reverse squeeze broadcast new_axis stack put_slice)a

    defp exact?(_call, _vals, out) when is_tuple(out), do: false

    defp exact?({_, f}, vals, out) do
      cond do
        Nx.Type.integer?(out.type) ->
          true

        f not in @rounded ->
          false

        not Enum.all?(vals, & &1.exact) ->
          false

        # an int above 2^24 becomes a different f32 than BinaryBackend's exact arithmetic
        out.type != {:f, 64} and Enum.any?(vals, &(int_type?(&1.t.type) and max_abs(&1.t) > 16_777_216)) ->
          false

        true ->
          true
      end
    end

    defp zsign?({_, f}, vals), do: f in @shape_ops and Enum.all?(vals, & &1.zsign)

    # Where BinaryBackend's answer is not the IEEE/libm one, or is documented to differ
    # (guides/backend.md), the program would test the reference.
    defp reference_wrong?({:nx, f}, args, out) do
      vals = tensor_vals(args)
      [a | _] = vals ++ [nil]

      cond do
        # Nx promotes an integer operand to the float type first (s32 to f32 rounds above
        # 2^24): ExBurn does, BinaryBackend computes on the exact integer, so sin(2147483647)
        # differs entirely
        Enum.any?(vals, &(int_type?(&1.t.type) and max_abs(&1.t) > 16_777_216)) and
            Enum.any?(out_types(out) ++ Enum.map(vals, & &1.t.type), &(Nx.Type.float?(&1) and &1 != {:f, 64})) ->
          true

        # BinaryBackend's element-wise ops fail on zero-size tensors, or return malformed ones
        Enum.any?(List.wrap(if(is_tuple(out), do: Tuple.to_list(out), else: out)), &(Nx.size(&1) == 0)) ->
          true

        true ->
          reference_wrong_op?(f, args, vals, a, out)
      end
    end

    defp reference_wrong?(_call, _args, _out), do: false

    defp out_types(out),
      do:
        for(
          %Nx.Tensor{type: type} <- List.wrap(if(is_tuple(out), do: Tuple.to_list(out), else: out)),
          do: type
        )

    defp reference_wrong_op?(f, args, vals, a, out) do
      case f do
        # BinaryBackend: tanh(±Inf) = NaN
        :tanh ->
          has?(a.t, :inf)

        # BinaryBackend: sign(NaN) = sign(-Inf) = 1
        :sign ->
          float?(a.t) and (has?(a.t, :nan) or has?(a.t, :inf))

        # BinaryBackend: clip(NaN) is the lower bound
        :clip ->
          float?(a.t) and has?(a.t, :nan)

        # BinaryBackend's erf_inv is an approximation good to ~1e-8 (ExBurn's is correctly rounded)
        :erf_inv ->
          out.type == {:f, 64}

        # a signed zero (from abs, cbrt, rounding, ...) decides atan2(±0, x) and atan2(y, ±0)
        # BinaryBackend: atan2(-0.75, -Inf) = π (IEEE: -π)
        :atan2 ->
          (not Enum.all?(vals, & &1.zsign) and Enum.any?(vals, &has?(&1.t, :zero))) or
            Enum.any?(vals, &has?(&1.t, :inf))

        # float to integer of NaN/±Inf: the device's conversion (guides/backend.md 3); of finite
        # values out of the integer type's range BinaryBackend wraps (-3.25 to u8 is 253) where
        # ExBurn saturates (0): Nx does not define either
        :as_type ->
          int_type?(out.type) and float?(a.t) and not in_int_range?(a.t, out.type)

        # BinaryBackend: pow(0.5, -Inf) = 0 (IEEE: Inf), pow(NaN, 0) = NaN (IEEE: 1), or raises
        :pow ->
          Enum.any?(vals, &(has?(&1.t, :inf) or has?(&1.t, :nan)))

        # a pad value outside the tensor's type (-1 for u8) widens the result (s16) in defn, and
        # BinaryBackend writes it as a malformed binary
        :pad ->
          out.type != a.t.type or not representable?(Enum.at(args, 1), a.t.type)

        # the reduction order of large magnitudes decides cancellations
        r when r in [:sum, :product, :mean, :dot, :cumulative_sum] ->
          Enum.any?(vals, &(float?(&1.t) and max_abs(&1.t) > 1.0e4))

        _ ->
          false
      end
    end

    defp float?(t), do: Nx.Type.float?(t.type)

    defp representable?(n, {:u, _}) when is_number(n), do: n >= 0 and is_integer(n)
    defp representable?(n, {:s, _}) when is_number(n), do: is_integer(n)
    defp representable?(_n, _type), do: true

    defp has?(t, what) do
      if float?(t) do
        t = Nx.as_type(t, {:f, 64})

        case what do
          :nan -> Nx.any(Nx.is_nan(t))
          :inf -> Nx.any(Nx.is_infinity(t))
          :zero -> Nx.any(Nx.equal(t, 0))
        end
        |> Nx.to_number() == 1
      else
        what == :zero and Nx.to_number(Nx.any(Nx.equal(t, 0))) == 1
      end
    end

    # the largest finite magnitude
    defp max_abs(t) do
      t = Nx.as_type(t, {:f, 64})
      finite = Nx.select(Nx.logical_or(Nx.is_nan(t), Nx.is_infinity(t)), 0.0, Nx.abs(t))
      if Nx.size(t) == 0, do: 0.0, else: Nx.to_number(Nx.reduce_max(finite))
    end

    defp in_int_range?(t, type) do
      {lo, hi} =
        Nx.Constants.min_finite(type)
        |> Nx.to_number()
        |> then(&{&1, Nx.to_number(Nx.Constants.max_finite(type))})

      t = Nx.as_type(t, {:f, 64})
      finite = Nx.logical_not(Nx.logical_or(Nx.is_nan(t), Nx.is_infinity(t)))
      # truncation toward zero must land in [lo, hi]
      ok = Nx.logical_and(finite, Nx.logical_and(Nx.greater(t, lo - 1.0), Nx.less(t, hi + 1.0)))
      Nx.to_number(Nx.all(ok)) == 1
    end

    # Re-evaluates on perturbed inexact float operands; the result must move by well under the
    # comparison tolerance (ints: not at all).
    defp stable?(call, args, out, err) do
      if Enum.all?(tensor_vals(args), &(&1.exact or not float?(&1.t))) do
        true
      else
        Enum.all?([1, -1], fn sign ->
          perturbed = perturb_args(args, sign)

          case attempt(fn -> apply_call(call, perturbed) end) do
            {:ok, moved} -> close?(moved, out, err)
            :reject -> false
          end
        end)
      end
    end

    defp perturb_args(args, sign) when is_list(args), do: Enum.map(args, &perturb_args(&1, sign))

    defp perturb_args(%{t: t, exact: exact, err: err}, sign) do
      if exact or not float?(t) do
        t
      else
        d = perturbation(err)

        signs =
          Nx.tensor(for(_ <- 1..Nx.size(t)//1, do: pick([-1.0, 1.0])), type: {:f, 64}) |> Nx.reshape(t.shape)

        wide = Nx.as_type(t, {:f, 64})
        delta = wide |> Nx.abs() |> Nx.multiply(d) |> Nx.add(d) |> Nx.multiply(signs) |> Nx.multiply(sign)
        moved = Nx.select(Nx.is_infinity(wide), wide, Nx.add(wide, Nx.select(Nx.is_nan(wide), 0.0, delta)))
        Nx.as_type(moved, t.type)
      end
    end

    defp perturb_args(other, _sign), do: other

    defp close?(a, b, err) when is_tuple(a), do: close?(Tuple.to_list(a), Tuple.to_list(b), err)
    defp close?(a, b, err) when is_list(a), do: Enum.all?(Enum.zip_with(a, b, &close?(&1, &2, err)))

    defp close?(a, b, err) do
      cond do
        a.shape != b.shape or a.type != b.type ->
          false

        Nx.Type.float?(b.type) ->
          {atol, rtol} = tol(err || b.type)
          Nx.to_number(Nx.all_close(a, b, atol: atol / 4, rtol: rtol / 4, equal_nan: true)) == 1

        true ->
          Nx.to_number(Nx.all(Nx.equal(a, b))) == 1
      end
    end

    ## Evaluation (traced under jit, by either compiler)

    defp eval_block(%{instrs: instrs, out: out}, env) do
      env =
        Enum.reduce(instrs, env, fn {id, call, args}, env ->
          Map.put(env, id, eval_call(call, resolve(args, env), env))
        end)

      resolve(out, env)
    end

    defp eval_call({:nx, f}, args, _env), do: apply(Nx, f, args)
    defp eval_call({:linalg, f}, args, _env), do: apply(Nx.LinAlg, f, args)

    defp eval_call({:while, n, block}, [init], env),
      do: Funs.fixed_loop(init, &eval_block(block, bind(env, block, [&1])), n: n)

    defp eval_call({:guarded_while, n, limit, block}, [init], env),
      do: Funs.guarded_loop(init, &eval_block(block, bind(env, block, [&1])), n: n, limit: limit)

    defp eval_call({:cond, tb, fb}, [pred], env),
      do: Funs.branch(pred, fn -> eval_block(tb, env) end, fn -> eval_block(fb, env) end)

    defp eval_call({:grad, :grad, block}, [x], env),
      do: Nx.Defn.grad(x, &eval_block(block, bind(env, block, [&1])))

    defp eval_call({:grad, :value_and_grad, block}, [x], env),
      do: Nx.Defn.value_and_grad(x, &eval_block(block, bind(env, block, [&1])))

    defp bind(env, %{params: params}, args), do: Map.merge(env, Map.new(Enum.zip(params, args)))

    defp resolve({:"$ref", id}, env), do: Map.fetch!(env, id)
    defp resolve({:tuple, refs}, env), do: refs |> Enum.map(&resolve(&1, env)) |> List.to_tuple()
    defp resolve({:"$const", t}, _env), do: t
    defp resolve(list, env) when is_list(list), do: Enum.map(list, &resolve(&1, env))
    defp resolve(other, _env), do: other

    ## Rendering

    @doc "The program as the Elixir (defn) code it runs, with its inputs."
    def render(%{params: params} = program) do
      names = Map.new(Enum.with_index(params), fn {id, i} -> {id, "x#{i}"} end)
      args = Enum.map_join(params, ", ", &names[&1])

      inputs =
        Enum.zip_with(params, program.inputs, fn id, t -> "#{names[id]} = #{render_tensor(t)}" end)
        |> Enum.join("\n")

      """
      # program #{program.index} of seed #{program.seed}: #{program.kind}, depth #{program.depth}
      # (ExBurn.ProgramGen.program(#{program.seed}, #{program.index}))
      #{inputs}
      fn #{args} ->
      #{render_block(program, names, "  ")}
      end
      """
    end

    defp render_tensor(t) do
      data = if Nx.rank(t) == 0, do: Nx.to_number(t), else: Nx.to_list(t)
      "Nx.tensor(#{inspect(data, limit: :infinity)}, type: #{inspect(t.type)})"
    end

    defp name(names, id), do: Map.get(names, id, "v#{id}")

    defp render_block(%{instrs: instrs, out: out}, names, indent) do
      lines = Enum.map(instrs, &render_instr(&1, names, indent))
      Enum.join(lines ++ [indent <> render_arg(out, names)], "\n")
    end

    defp render_instr({id, {:nx, f}, args}, names, indent),
      do: "#{indent}#{name(names, id)} = Nx.#{f}(#{render_args(args, names)})"

    defp render_instr({id, {:linalg, f}, args}, names, indent),
      do: "#{indent}#{name(names, id)} = Nx.LinAlg.#{f}(#{render_args(args, names)})"

    defp render_instr({id, {loop, n, limit, block}, [init]}, names, indent) when loop == :guarded_while,
      do:
        render_loop(
          id,
          n,
          " and Nx.sum(#{name(names, hd(block.params))}) < #{limit}",
          block,
          init,
          names,
          indent
        )

    defp render_instr({id, {:while, n, block}, [init]}, names, indent),
      do: render_loop(id, n, "", block, init, names, indent)

    defp render_instr({id, {:cond, tb, fb}, [pred]}, names, indent) do
      """
      #{indent}#{name(names, id)} =
      #{indent}  if #{render_arg(pred, names)} do
      #{render_block(tb, names, indent <> "    ")}
      #{indent}  else
      #{render_block(fb, names, indent <> "    ")}
      #{indent}  end\
      """
    end

    defp render_instr({id, {:grad, mode, block}, [x]}, names, indent) do
      """
      #{indent}#{name(names, id)} =
      #{indent}  Nx.Defn.#{mode}(#{render_arg(x, names)}, fn #{name(names, hd(block.params))} ->
      #{render_block(block, names, indent <> "    ")}
      #{indent}  end)\
      """
    end

    defp render_loop(id, n, guard, block, init, names, indent) do
      s = name(names, hd(block.params))

      """
      #{indent}{_, #{name(names, id)}} =
      #{indent}  while {i = 0, #{s} = #{render_arg(init, names)}}, i < #{n}#{guard} do
      #{render_block(%{block | out: {:raw, "{i + 1, #{render_arg(block.out, names)}}"}}, names, indent <> "    ")}
      #{indent}  end\
      """
    end

    defp render_args(args, names), do: Enum.map_join(args, ", ", &render_arg(&1, names))

    defp render_arg({:raw, s}, _names), do: s
    defp render_arg({:"$ref", id}, names), do: name(names, id)
    defp render_arg({:tuple, refs}, names), do: "{" <> render_args(refs, names) <> "}"
    defp render_arg({:"$const", t}, _names), do: render_tensor(t)

    defp render_arg(list, names) when is_list(list) do
      if Keyword.keyword?(list) and list != [] and not Enum.any?(list, &match?({:"$ref", _}, &1)),
        do: inspect(list, limit: :infinity),
        else: "[" <> render_args(list, names) <> "]"
    end

    defp render_arg(other, _names), do: inspect(other, limit: :infinity)
  end
end
