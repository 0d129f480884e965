# Compiled only where Nx is present (doctest/Nx calls expand at compile time); the :nx tag
# keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.DoctestTest do
    # Nx's own documentation examples, run with ExBurn.Backend as the default backend. The
    # examples compare printed values exactly; every exclusion below is a last-digits difference
    # of a float result, not a wrong value.
    use ExUnit.Case, async: false

    @moduletag :nx

    setup do
      previous = Nx.default_backend(ExBurn.Backend)
      on_exit(fn -> Nx.default_backend(previous) end)
    end

    doctest Nx,
      except: [
        # The doctest prints BinaryBackend's approximation (erf_inv(0.1) = 0.08885598780483887);
        # ExBurn returns the correctly rounded 0.08885599049425769 (2.7e-9 closer to the truth).
        erf_inv: 1
      ]

    doctest Nx.LinAlg
  end
end
