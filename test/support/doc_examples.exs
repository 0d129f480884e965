defmodule ExBurn.DocExamples do
  @moduledoc """
  Runs the ```elixir blocks of a Markdown file as tests: a line `# => value` asserts that the code
  since the previous assertion evaluates to `value`. Each block runs with the binding and aliases
  its earlier chunks left; with `shared: true` the blocks run in order as one test and later
  blocks see earlier blocks' variables (a guide that builds one example step by step).

      use ExBurn.DocExamples, file: "guides/devices.md"
      use ExBurn.DocExamples, file: "guides/training.md", shared: true, min_blocks: 8, min_assertions: 15

  A block right after a comment `<!-- requires: embedding:NAME llm:NAME -->` needs those
  pre-trained models (`ExBurn.Models.list/0`): its test is skipped, with the reason, when one is
  not installed (with `shared: true`, the whole file's test is).
  """

  defmacro __using__(opts) do
    file = Path.expand(Keyword.fetch!(opts, :file), Path.expand("../..", __DIR__))

    {blocks, skips} =
      Regex.scan(~r/(?:<!-- requires: ([^>]*?) -->\s*\n)?```elixir\n(.*?)```/s, File.read!(file),
        capture: :all_but_first
      )
      |> Enum.map(fn [requires, block] -> {block, ExBurn.DocExamples.missing_models(requires)} end)
      |> Enum.unzip()

    quote bind_quoted: [file: file, blocks: blocks, skips: skips, opts: opts] do
      @external_resource file

      test "#{Path.basename(file)} has Elixir examples" do
        assert unquote(length(blocks)) >= max(1, unquote(Keyword.get(opts, :min_blocks, 1)))
      end

      if Keyword.get(opts, :shared, false) do
        @blocks blocks
        if skip = Enum.find(skips, & &1), do: @tag(skip: skip)

        test "#{Path.basename(file)} examples, in order" do
          count = ExBurn.DocExamples.run_blocks(@blocks, unquote(file))
          assert count >= unquote(Keyword.get(opts, :min_assertions, 1))
        end
      else
        for {{block, skip}, index} <- Enum.with_index(Enum.zip(blocks, skips), 1) do
          @block block
          if skip, do: @tag(skip: skip)

          test "#{Path.basename(file)} example #{index}" do
            assert ExBurn.DocExamples.run_block(@block, unquote(file)) >= 1
          end
        end
      end
    end
  end

  import ExUnit.Assertions

  # test/support/pretrained_case.exs is loaded after this file
  @compile {:no_warn_undefined, ExBurn.PretrainedCase}

  @doc "A skip reason for a `requires:` list (`kind:name` words) naming a missing model, else nil."
  def missing_models(requires) do
    requires
    |> String.split()
    |> Enum.find_value(fn word ->
      [kind, name] = String.split(word, ":", parts: 2)
      ExBurn.PretrainedCase.skip_unless_installed(String.to_existing_atom(kind), name)
    end)
  end

  @doc "Evaluates a block, checking its `# =>` lines; returns how many it checked."
  def run_block(block, file) do
    {_binding, _env, count} = run_chunks(block, file, [], Code.env_for_eval(file: file))
    count
  end

  @doc "Evaluates blocks in order with one binding; returns how many `# =>` lines it checked."
  def run_blocks(blocks, file) do
    {_binding, _env, count} =
      Enum.reduce(blocks, {[], Code.env_for_eval(file: file), 0}, fn block, {binding, env, total} ->
        {binding, env, count} = run_chunks(block, file, binding, env)
        {binding, env, total + count}
      end)

    count
  end

  defp run_chunks(block, file, binding, env) do
    {binding, env, pending, count} =
      block
      |> String.split("\n")
      |> Enum.reduce({binding, env, [], 0}, fn line, {binding, env, pending, count} ->
        case Regex.run(~r/^\s*# => (.*)$/, line) do
          [_, expected] ->
            code = pending |> Enum.reverse() |> Enum.join("\n")
            {value, binding, env} = eval(code, binding, env, file)
            {expected_value, _} = Code.eval_string(expected)
            assert value == expected_value, "#{file}: #{code}\n  expected #{expected}, got #{inspect(value)}"
            {binding, env, [], count + 1}

          nil ->
            {binding, env, [line | pending], count}
        end
      end)

    # trailing code without an assertion must still run
    if Enum.any?(pending, &(String.trim(&1) != "")) do
      {_value, binding, env} = eval(pending |> Enum.reverse() |> Enum.join("\n"), binding, env, file)
      {binding, env, count}
    else
      {binding, env, count}
    end
  end

  defp eval(code, binding, env, file) do
    Code.eval_quoted_with_env(Code.string_to_quoted!(code, file: file), binding, env)
  end
end
