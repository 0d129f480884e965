# Compiled only where Nx is present (Nx calls would warn as undefined); the :nx tag keeps it
# out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Serving.NxGuideTest do
    use ExUnit.Case, async: true
    @moduletag :nx
    use ExBurn.DocExamples, file: "guides/serving_nx.md"
  end
end
