defmodule ExBurn.Bench.Python do
  @moduledoc false
  # Runs priv/bench/reference.py (sentence-transformers, transformers, PyTorch) for the suites
  # that have a Python reference, after ExBurn's cases, and turns its answer into case maps.

  alias ExBurn.Bench

  def run(suites, opts) do
    python = System.find_executable("python3") || System.find_executable("python")
    script = Path.join(:code.priv_dir(:ex_burn), "bench/reference.py")

    cond do
      python == nil -> {:skip, "python3 is not installed"}
      not File.exists?(script) -> {:skip, "#{script} is missing"}
      true -> call(python, script, request(suites, opts))
    end
  end

  defp request(suites, opts) do
    models = ExBurn.Models.list(Keyword.take(opts, [:dir]))
    path = fn kind, name -> Enum.find_value(models, &(&1.kind == kind and &1.name == name and &1.path)) end

    %{
      suites: Enum.map(suites, &to_string/1),
      iterations: opts[:iterations],
      threads: System.schedulers_online(),
      texts: ExBurn.Bench.Embed.texts(),
      prompt: ExBurn.Bench.LLM.prompt(),
      tokens: ExBurn.Bench.LLM.tokens(),
      embed_dir: path.(:embedding, "all-minilm-l6-v2"),
      gguf: path.(:llm, "smollm2-135m-instruct"),
      ops: ExBurn.Bench.Ops.cases()
    }
  end

  defp call(python, script, request) do
    input = Path.join(System.tmp_dir!(), "ex_burn_bench_#{System.unique_integer([:positive])}.json")
    File.write!(input, ExBurn.JSON.encode!(request))

    try do
      case System.cmd("sh", ["-c", "exec \"$0\" \"$1\" < \"$2\"", python, script, input],
             stderr_to_stdout: false
           ) do
        {out, 0} ->
          %{"cases" => cases, "notes" => notes} =
            out |> String.split("\n", trim: true) |> List.last() |> ExBurn.JSON.decode!()

          {:ok, Enum.map(cases, &to_case/1), Enum.map(notes, &("python: " <> &1))}

        {_, status} ->
          {:skip, "reference.py exited with status #{status}"}
      end
    after
      File.rm(input)
    end
  end

  defp to_case(c) do
    fields = for k <- ~w(suite case engine device implementation), into: %{}, do: {String.to_atom(k), c[k]}
    Bench.case_map(fields, c["samples_ms"], c["items"], c["unit"])
  end
end
