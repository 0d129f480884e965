defmodule ExBurn.NxSuite.Verdicts do
  @moduledoc false
  # An ExUnit formatter for test/nx_suite/run.exs: collects the failures of Nx's own tests and
  # sorts each into a known, explained class or "unexplained". Only unexplained failures fail the
  # run; each class is printed with its count and why it is not a fault of ExBurn.
  use GenServer

  @classes [
    {:equal_values,
     "`==` between two tensor structs holding equal types, shapes and bytes (another backend's " <>
       "struct, or another reference to equal data)", same_values: true},
    {:literal_on_backend,
     "Nx.Defn.Expr inlines tensors captured by closures (defn, grad) only from Nx.BinaryBackend; " <>
       "any other backend (EXLA, Torchx, ExBurn, this checker) gets this error, as Nx documents",
     message: "cannot convert tensor allocated on ExBurn.NxSuite.CheckedBackend",
     message: "non-default backend (ExBurn.NxSuite.CheckedBackend)",
     message: "Nx.Defn.Expr and ExBurn.NxSuite.CheckedBackend"},
    {:random_property,
     "properties checked on fresh random inputs each run (System.unique_integer seed), which fail " <>
       "for some seeds on Nx.BinaryBackend too: eigh with atol 1e-7 (1 of 30 seeds on both, " <>
       "identical errors); least_squares of noisy, sometimes ill-conditioned systems with atol " <>
       "0.1 (2 of 300 seeds on ExBurn, both among the 10 that fail or raise on BinaryBackend)",
     test:
       ~r/^test eigh properties for matrices with different eigenvalues$|^test least_squares properties for linear equations$/},
    {:otp_negative_zero,
     "the test's -0.0 literal is +0.0 before OTP 27; Nx.BinaryBackend fails these too on this OTP",
     test: ~r/^test (f8|bf16) pretty printing$|^test f8_e4m3fn dump_f8_e4m3fn\/1$/},
    {:erf_inv,
     "erf_inv is correctly rounded here; BinaryBackend prints its approximation (Nx.Random's normal " <>
       "samples go through it: 1-ulp differences)",
     test:
       ~r/^doctest Nx\.erf_inv\/1|^doctest Nx\.Random\.(normal|multivariate_normal)\/4|^test types (normal|multivariate_normal)$/},
    {:bf16_rounding,
     "bf16 results round to nearest even (as PyTorch and XLA); Nx.BinaryBackend truncates f32 to bf16",
     test: ~r/^test types uniform$/},
    {:remainder_nonfinite,
     "remainder(-inf, inf) is NaN (IEEE fmod); Nx.BinaryBackend raises Erlang's ArgumentError",
     test: ~r/^test binary operations remainder$/},
    {:float_order,
     "exact equality on floats that differ in the last bit or the sign of a zero (summation order)",
     test: ~r/^test take computes gradient$|^test qr factors a square matrix$/},
    {:foreign_test_backends,
     "Nx's test-only backends mixed with the checker's tensors (which Nx allows for BinaryBackend only)",
     message: "Nx.OptionalTest.NonCustomImplTestBackend",
     message: "Nx.OptionalTest.CustomImplTestBackend",
     message: "Nx.TemplateBackend and ExBurn.NxSuite.CheckedBackend"},
    {:compiler_visible,
     "--compiler only: the test asserts what the Evaluator gives, not values: the global compiler " <>
       "option shows in serving options, hooks and streamed hook values are ExBurn tensors (equal " <>
       "values, another struct), and partitions follow ExBurn's :devices instead of one per scheduler",
     compiler: true, module: Nx.ServingTest, test: ~r/hook|^test cond only executes selected branches$/}
  ]

  # failures go to a public ETS table the runner owns: ExUnit stops its formatters when the run ends
  @table :ex_burn_nx_suite_failures

  def new_table, do: :ets.new(@table, [:named_table, :public, :bag])
  def recorded, do: :ets.tab2list(@table)

  @impl true
  def init(_opts), do: {:ok, nil}

  @impl true
  def handle_cast({:test_finished, %ExUnit.Test{state: {:failed, failures}} = test}, state) do
    message =
      Enum.map_join(failures, "\n", fn {kind, reason, stack} -> Exception.format(kind, reason, stack) end)

    same? = Enum.all?(failures, fn {_, reason, _} -> same_values?(reason) end)
    :ets.insert(@table, {test.module, Atom.to_string(test.name), message, same?})
    {:noreply, state}
  end

  def handle_cast(_event, state), do: {:noreply, state}

  # an `==` that failed between tensors (or containers of them) of equal types, shapes and bytes:
  # two structs of other backends, or of one backend with different references
  defp same_values?(%ExUnit.AssertionError{left: left, right: right}) do
    l = Nx.Defn.Composite.flatten_list([left])
    r = Nx.Defn.Composite.flatten_list([right])

    length(l) == length(r) and l != [] and
      Enum.all?(Enum.zip(l, r), fn {a, b} ->
        match?(%Nx.Tensor{}, a) and match?(%Nx.Tensor{}, b) and
          {a.type, a.shape, a.names, a.vectorized_axes} == {b.type, b.shape, b.names, b.vectorized_axes} and
          Nx.to_binary(a) == Nx.to_binary(b)
      end)
  rescue
    _ -> false
  end

  defp same_values?(_), do: false

  @doc "Sorts `failures` into `{class, why, [failure]}` lists; unexplained ones last."
  def classify(failures, compiler?) do
    {known, rest} =
      Enum.map_reduce(@classes, failures, fn {class, why, rules}, left ->
        {hit, left} = Enum.split_with(left, &matches?(&1, rules, compiler?))
        {{class, why, hit}, left}
      end)

    known ++ [{:unexplained, "not explained: a fault to look at", rest}]
  end

  defp matches?({module, name, message, same?}, rules, compiler?) do
    {needs_compiler, rules} = Keyword.pop_values(rules, :compiler)

    (needs_compiler == [] or compiler?) and
      Enum.any?(rules, fn
        {:message, text} -> String.contains?(message, text)
        {:test, re} -> name =~ re
        {:module, m} -> module == m
        {:same_values, flag} -> same? == flag
      end)
  end

  @doc """
  Prints the run's verdict under `title` (counts, then each class with its reason, the
  unexplained failures by name) and returns the exit status: 0 when every failure is explained.
  """
  def report(title, %{total: total, failures: failures} = result, compiler?) do
    run = total - Map.get(result, :excluded, 0)
    classes = classify(recorded(), compiler?)
    IO.puts("\n#{title}: #{run} run, #{run - failures} pass, #{failures} fail")

    for {class, why, hits} <- classes, hits != [] do
      IO.puts("  #{length(hits)} #{class}: #{why}")

      if class == :unexplained,
        do: Enum.each(hits, fn {m, name, _, _} -> IO.puts("      #{inspect(m)}: #{name}") end)
    end

    {_, _, unexplained} = List.last(classes)
    if unexplained == [], do: 0, else: 1
  end
end
