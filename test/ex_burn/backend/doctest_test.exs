defmodule ExBurn.Backend.DoctestTest do
  # Nx's own documentation examples, run with ExBurn.Backend as the default backend.
  use ExUnit.Case, async: false

  @moduletag :nx

  setup do
    previous = Nx.default_backend(ExBurn.Backend)
    on_exit(fn -> Nx.default_backend(previous) end)
  end

  if Code.ensure_loaded?(Nx) do
    doctest Nx, except: []
    doctest Nx.LinAlg, except: []
  end
end
