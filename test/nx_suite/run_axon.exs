# Axon's own test suite (its test/ directory) through ExBurn's backend and compiler:
#
#     source <Nx env>   # Nx and Axon as path dependencies: EXBURN_AXON_PATH=/path/to/axon
#     EXBURN_NX_SUITE=1 MIX_ENV=test mix run test/nx_suite/run_axon.exs [FILE...]
#
# Axon's suite switches compiler and backend only through USE_EXLA / USE_TORCHX
# (test/support/axon_test_util.ex): with USE_EXLA set it compiles every model with `EXLA`, keeps
# tensors on `EXLA.Backend`, and leaves out the doctests and the tests tagged :skip_exla. Here
# `EXLA` and `EXLA.Backend` are stand-ins that delegate to ExBurn.Defn.Compiler and
# ExBurn.Backend (the real EXLA must not be loaded). FILEs are paths under Axon's test/.
{_opts, files} = OptionParser.parse!(System.argv(), strict: [])

axon =
  System.get_env("EXBURN_AXON_PATH") ||
    raise "EXBURN_AXON_PATH must name the Axon checkout"

unless Code.ensure_loaded?(Axon), do: raise("Axon is not loaded: run in an environment with Axon (see above)")
if Code.ensure_loaded?(EXLA), do: raise("EXLA is loaded: this runner stands in for it")

defmodule EXLA do
  @moduledoc false
  @behaviour Nx.Defn.Compiler
  defdelegate __jit__(key, vars, fun, args, opts), to: ExBurn.Defn.Compiler
  defdelegate __compile__(key, vars, fun, opts), to: ExBurn.Defn.Compiler
  defdelegate __partitions_options__(opts), to: ExBurn.Defn.Compiler
  defdelegate __to_backend__(opts), to: ExBurn.Defn.Compiler
end

defmodule EXLA.Backend do
  @moduledoc false
  for {name, arity} <- Nx.Backend.behaviour_info(:callbacks) do
    args = Macro.generate_arguments(arity, __MODULE__)
    def unquote(name)(unquote_splicing(args)), do: apply(ExBurn.Backend, unquote(name), unquote(args))
  end
end

System.put_env("USE_EXLA", "1")
Nx.global_default_backend(ExBurn.Backend)
Nx.Defn.global_default_options(compiler: ExBurn)
ExBurn.Defn.Compiler.reset_stats()
Code.require_file("verdicts.ex", __DIR__)
ExBurn.NxSuite.Verdicts.new_table()

ExUnit.start(
  autorun: false,
  exclude: [test_type: :doctest, integration: true, skip_exla: true],
  assert_receive_timeout: 1000,
  formatters: [ExUnit.CLIFormatter, ExBurn.NxSuite.Verdicts]
)

for f <- Path.wildcard(Path.join(axon, "test/support/**/*.ex")), do: Code.require_file(f)
File.cd!(axon)
files = if files == [], do: Path.wildcard("test/**/*_test.exs"), else: files
for f <- files, do: Code.require_file(f)

result = ExUnit.run()
stats = ExBurn.Defn.Compiler.stats()

IO.puts(
  "\nExBurn's compiler in that run: #{stats[:native] || 0} native compilations, " <>
    "#{stats[:native_runs] || 0} native runs, #{stats[:hosted] || 0} hosted nodes, " <>
    "#{stats[:fallback] || 0} whole-graph fallbacks"
)

System.halt(
  ExBurn.NxSuite.Verdicts.report("Axon's own tests through ExBurn (backend + compiler)", result, true)
)
