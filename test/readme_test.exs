defmodule ExBurn.ReadmeTest do
  # Runs every ```elixir block of README.md; a line `# => value` asserts that the code since the
  # previous assertion evaluates to `value`.
  use ExUnit.Case, async: true

  @readme Path.expand("../README.md", __DIR__)
  @external_resource @readme

  blocks =
    Regex.scan(~r/```elixir\n(.*?)```/s, File.read!(@readme), capture: :all_but_first)
    |> Enum.map(&hd/1)

  test "README has Elixir examples" do
    assert length(unquote(Macro.escape(blocks))) >= 1
  end

  for {block, index} <- Enum.with_index(blocks) do
    @block block
    test "README example #{index + 1}" do
      assertions = run_block(@block)
      assert assertions >= 1
    end
  end

  # Splits the block at `# => expected` lines; evaluates each chunk with the binding and
  # environment (aliases) left by the previous chunks.
  defp run_block(block) do
    env = Code.env_for_eval(file: @readme)

    {binding, env, pending, count} =
      block
      |> String.split("\n")
      |> Enum.reduce({[], env, [], 0}, fn line, {binding, env, pending, count} ->
        case Regex.run(~r/^\s*# => (.*)$/, line) do
          [_, expected] ->
            code = pending |> Enum.reverse() |> Enum.join("\n")
            {value, binding, env} = eval(code, binding, env)
            {expected_value, _} = Code.eval_string(expected)
            assert value == expected_value, "README: #{code}\n  expected #{expected}, got #{inspect(value)}"
            {binding, env, [], count + 1}

          nil ->
            {binding, env, [line | pending], count}
        end
      end)

    # trailing code without an assertion must still run
    if Enum.any?(pending, &(String.trim(&1) != "")),
      do: eval(pending |> Enum.reverse() |> Enum.join("\n"), binding, env)

    count
  end

  defp eval(code, binding, env) do
    Code.eval_quoted_with_env(Code.string_to_quoted!(code, file: @readme), binding, env)
  end
end
