Code.require_file("support.exs", __DIR__)

defmodule ExBurn.Server.GuideTest do
  # guides/server.md: its elixir blocks in order (DocExamples), and its curl lines and Python
  # example against a server of this test (the guide's http://localhost:8080 replaced by its URL).
  use ExUnit.Case, async: false
  use ExBurn.DocExamples, file: "guides/server.md", shared: true, min_blocks: 8, min_assertions: 12

  alias ExBurn.ServerTest.Support

  @guide File.read!(Path.expand("../../../guides/server.md", __DIR__))
  @curl_lines Regex.scan(~r/```shell\n(.*?)```/s, @guide, capture: :all_but_first)
              |> Enum.flat_map(fn [block] -> String.split(block, "\n", trim: true) end)
              |> Enum.filter(&String.starts_with?(&1, "curl "))
  @python (case Regex.run(~r/```python\n(.*?)```/s, @guide, capture: :all_but_first) do
             [code] -> code
             nil -> nil
           end)

  python = System.find_executable("python3")

  @python_exe python
  @openai? python != nil and
             match?({_, 0}, System.cmd(python, ["-c", "import openai"], stderr_to_stdout: true))
  @skip_models Support.skip_without_models()

  defp start_server do
    name = :"guide_shell_#{System.unique_integer([:positive])}"
    start_supervised!({ExBurn.Server, name: name, port: 0, token: "secret", preload: :all})
    ExBurn.Server.url(name)
  end

  test "the guide has curl examples and a Python example" do
    assert length(@curl_lines) >= 4
    assert @python =~ "OpenAI(base_url=\"http://localhost:8080/v1\""
  end

  if @skip_models || !System.find_executable("curl"), do: @tag(skip: @skip_models || "curl is not installed")

  test "the guide's curl lines succeed" do
    url = start_server()

    for line <- @curl_lines do
      command =
        line |> String.replace("http://localhost:8080", url) |> String.replace_prefix("curl ", "curl -f ")

      {out, status} =
        System.cmd("sh", ["-c", command], env: [{"EXBURN_API_TOKEN", "secret"}], stderr_to_stdout: true)

      assert status == 0, "#{line}\n#{out}"

      if String.contains?(line, "\"stream\": true") do
        assert String.ends_with?(String.trim(out), "data: [DONE]")
      else
        assert %{} = ExBurn.JSON.decode!(out)
      end
    end
  end

  if @skip_models || !@openai?,
    do: @tag(skip: @skip_models || "python3 with the openai package is needed (pip install openai)")

  test "the guide's Python example runs" do
    url = start_server()
    script = Path.join(System.tmp_dir!(), "exburn_guide_#{System.unique_integer([:positive])}.py")
    File.write!(script, String.replace(@python, "http://localhost:8080", url))
    {out, status} = System.cmd(@python_exe, [script], stderr_to_stdout: true)
    File.rm(script)
    assert status == 0, out
    [dim | joke] = String.split(out, "\n", trim: true)
    assert dim == "384"
    assert joke != []
  end
end
