# What a cached `Nx.Defn.jit` call on ExBurn.Defn.Compiler costs: the first call (trace, lower,
# build the native program), a cache hit, and the same op on ExBurn.Backend with no compiler, in
# the same VM. guides/compiler.md quotes the hit's overhead.
#
#   mix run bench/defn_cache.exs [calls]
#
# Needs Nx (see guides/compiler.md).
unless Code.ensure_loaded?(Nx) do
  IO.puts("bench/defn_cache.exs needs Nx: skipped")
  System.halt(0)
end

Code.require_file("support/machine.exs", __DIR__)

n =
  case System.argv() do
    [calls | _] -> String.to_integer(calls)
    [] -> 2000
  end

x = Nx.tensor([1.0, 2.0, 3.0], backend: ExBurn.Backend)
jitted = Nx.Defn.jit(&Nx.add(&1, 1), compiler: ExBurn.Defn.Compiler)
load_before = Bench.Machine.loadavg()
{first, _} = :timer.tc(fn -> jitted.(x) end)
{hits, _} = :timer.tc(fn -> for _ <- 1..n, do: jitted.(x) end)
{direct, _} = :timer.tc(fn -> for _ <- 1..n, do: Nx.add(x, 1) end)

IO.puts(Bench.Machine.line())
IO.puts("load average #{load_before} -> #{Bench.Machine.loadavg()}, #{n} calls each")
IO.puts("first call (trace + build)    #{first} us")
IO.puts("cache hit                     #{Float.round(hits / n, 1)} us/call")
IO.puts("ExBurn.Backend op, no compiler #{Float.round(direct / n, 1)} us/call")
IO.puts("hit / backend op              #{Float.round(hits / direct, 2)}")
