# Nx's own test suite (its test/ directory) through ExBurn:
#
#     source <Nx env>   # Nx as a path dependency: EXBURN_NX_PATH=/path/to/nx/nx (the nx app)
#     EXBURN_NX_SUITE=1 MIX_ENV=test mix run test/nx_suite/run.exs [--compiler] [--only-failures] [FILE...]
#
# Every Nx.Backend callback runs on ExBurn.Backend (test/nx_suite/checked_backend.ex says how the
# results reach Nx's `==` assertions); with --compiler, defn also compiles with ExBurn's compiler.
# FILEs are paths under Nx's test/ (default: all of them). EXBURN_NX_SUITE=1 leaves protocols
# unconsolidated (mix.exs), which Nx's test support needs. Nothing of Nx is kept in this repo.
{opts, files} = OptionParser.parse!(System.argv(), strict: [compiler: :boolean])

nx =
  System.get_env("EXBURN_NX_PATH") ||
    raise "EXBURN_NX_PATH must name the Nx checkout's nx/ directory"

unless Code.ensure_loaded?(Nx), do: raise("Nx is not loaded: run in an environment with Nx (see above)")

if Protocol.consolidated?(Nx.Container),
  do: raise("protocols are consolidated: run with EXBURN_NX_SUITE=1 (and recompile if needed)")

Code.require_file("checked_backend.ex", __DIR__)
Code.require_file("checked_compiler.ex", __DIR__)
Code.require_file("verdicts.ex", __DIR__)
alias ExBurn.NxSuite.Verdicts

# before Nx's test files are compiled: the tensors they build in module attributes are ours too
Nx.global_default_backend(ExBurn.NxSuite.CheckedBackend)

if opts[:compiler],
  do: Nx.Defn.global_default_options(compiler: ExBurn.NxSuite.CheckedCompiler)

Verdicts.new_table()

ExUnit.start(
  autorun: false,
  exclude: [:distributed],
  assert_receive_timeout: 1000,
  formatters: [ExUnit.CLIFormatter, Verdicts]
)

for f <- Path.wildcard(Path.join(nx, "test/support/*.ex")), do: Code.require_file(f)
File.cd!(nx)

files =
  case files do
    [] -> Path.wildcard("test/**/*_test.exs")
    given -> given
  end

for f <- files, do: Code.require_file(f)
result = ExUnit.run()
mode = if opts[:compiler], do: "backend + compiler", else: "backend"
System.halt(Verdicts.report("Nx's own tests through ExBurn (#{mode})", result, opts[:compiler] == true))
