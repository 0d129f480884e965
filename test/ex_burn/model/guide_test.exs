defmodule ExBurn.Model.GuideTest do
  # Runs every ```elixir block of guides/training.md in order, sharing variables and aliases; a
  # line `# => value` asserts that the code since the previous assertion evaluates to `value`.
  use ExUnit.Case, async: false

  @guide Path.expand("../../../guides/training.md", __DIR__)
  @external_resource @guide

  @blocks Regex.scan(~r/```elixir\n(.*?)```/s, File.read!(@guide), capture: :all_but_first) |> Enum.map(&hd/1)

  test "the training guide's examples run and their results hold" do
    assert length(@blocks) >= 8

    {_binding, _env, count} =
      @blocks
      |> Enum.with_index(1)
      |> Enum.reduce({[], Code.env_for_eval(file: @guide), 0}, fn {block, index}, {binding, env, count} ->
        run_block(block, index, binding, env, count)
      end)

    assert count >= 15
  end

  defp run_block(block, index, binding, env, count) do
    {binding, env, pending, count} =
      block
      |> String.split("\n")
      |> Enum.reduce({binding, env, [], count}, fn line, {binding, env, pending, count} ->
        case Regex.run(~r/^\s*# => (.*)$/, line) do
          [_, expected] ->
            code = pending |> Enum.reverse() |> Enum.join("\n")
            {value, binding, env} = eval(code, binding, env)
            {expected_value, _} = Code.eval_string(expected)
            assert value == expected_value, "guide block #{index}: #{code}\n  expected #{expected}, got #{inspect(value)}"
            {binding, env, [], count + 1}

          nil ->
            {binding, env, [line | pending], count}
        end
      end)

    {binding, env} =
      if Enum.any?(pending, &(String.trim(&1) != "")) do
        {_value, binding, env} = eval(pending |> Enum.reverse() |> Enum.join("\n"), binding, env)
        {binding, env}
      else
        {binding, env}
      end

    {binding, env, count}
  end

  defp eval(code, binding, env) do
    Code.eval_quoted_with_env(Code.string_to_quoted!(code, file: @guide), binding, env)
  end
end
