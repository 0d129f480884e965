# Compiled only where Nx is present (doctest/Nx calls expand at compile time); the :nx tag
# keeps it out of runs without Nx either way.
if Code.ensure_loaded?(Nx) do
  defmodule ExBurn.Backend.GuideTest do
    # Runs every `elixir` block of guides/backend.md; `# => value` lines are assertions.
    use ExUnit.Case, async: false

    @moduletag :nx

    @guide Path.expand("../../../guides/backend.md", __DIR__)
    @external_resource @guide

    blocks =
      Regex.scan(~r/```elixir\n(.*?)```/s, File.read!(@guide), capture: :all_but_first)
      |> Enum.map(&hd/1)

    setup do
      previous = Nx.default_backend(Nx.BinaryBackend)
      on_exit(fn -> Nx.default_backend(previous) end)
    end

    for {block, i} <- Enum.with_index(blocks, 1) do
      @block block
      test "guide example #{i}" do
        run(@block)
      end
    end

    # Evaluates the block statement by statement; an expression followed by `# => expected`
    # must evaluate to `expected`.
    defp run(block) do
      lines = String.split(block, "\n")

      {binding, pending} =
        Enum.reduce(lines, {[], []}, fn line, {binding, pending} ->
          case Regex.run(~r/^# => (.*)$/, line) do
            [_, expected] ->
              {value, binding} = Code.eval_string(Enum.join(Enum.reverse(pending), "\n"), binding)
              {want, _} = Code.eval_string(expected)
              assert value == want, "#{Enum.join(Enum.reverse(pending), "\n")}\n=> #{inspect(value)}"
              {binding, []}

            _ ->
              {binding, [line | pending]}
          end
        end)

      Code.eval_string(Enum.join(Enum.reverse(pending), "\n"), binding)
    end
  end
end
