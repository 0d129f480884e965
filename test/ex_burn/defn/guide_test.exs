# Compiled only where Nx is present; the :nx tag keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Defn.GuideTest do
    use ExUnit.Case, async: false
    @moduletag :nx
    @moduletag :capture_log
    use ExBurn.DocExamples, file: "guides/compiler.md"
  end
end
