defmodule Mix.Tasks.ExBurn.Llm do
  @shortdoc "Generates text with a pre-trained LLM (GGUF)"
  @moduledoc """
  Generates a completion with a Llama-family GGUF model (see `ExBurn.LLM`):

      mix ex_burn.llm --model smollm2-135m-instruct --prompt "The capital of France is" --greedy
      mix ex_burn.llm --model smollm2-135m-instruct --chat --prompt "Tell me a joke" --stream
      mix ex_burn.llm --model path/to/model.gguf --prompt "Once upon a time" --max-tokens 32 --json

  * `--model NAME|PATH` - a model name in the models directory, or a `.gguf` file (required)
  * `--prompt TEXT` - the prompt (required); used as is, unless `--chat`
  * `--chat` - send the prompt as a user message through the model's chat template
  * `--max-tokens N` (default 256), `--greedy`, `--temperature T`, `--top-k K`, `--top-p P`,
    `--seed S`, `--stop STRING` (repeatable)
  * `--stream` - print the text as it is generated
  * `--json` - print `{"prompt_ids": [...], "generated_ids": [...], "text": ...}`
    (plus `finish_reason`)
  * `--engine auto|burn|candle`, `--device DEVICE`, `--dir DIR`
  """
  use Mix.Task
  alias ExBurn.Pretrained.CLI

  @usage "usage: mix ex_burn.llm --model NAME|PATH --prompt TEXT [--chat] [--max-tokens N] [--stream] [--greedy] [--json] [--engine E] [--device D]"
  @gen_switches [
    prompt: :string,
    chat: :boolean,
    max_tokens: :integer,
    greedy: :boolean,
    temperature: :float,
    top_k: :integer,
    top_p: :float,
    seed: :integer,
    stop: :keep,
    stream: :boolean,
    json: :boolean
  ]

  @impl true
  def run(args) do
    parsed = CLI.parse!(args, CLI.load_switches() ++ @gen_switches, @usage)
    text = parsed[:prompt] || Mix.raise("--prompt TEXT is required\n#{@usage}")
    prompt = if parsed[:chat], do: [%{role: "user", content: text}], else: text
    {model, opts} = CLI.load_args!(parsed, @usage)

    gen_opts =
      parsed
      |> Keyword.take([:max_tokens, :greedy, :temperature, :top_k, :top_p, :seed])
      |> Keyword.put(:stop, Keyword.get_values(parsed, :stop))

    CLI.start!()
    model = CLI.ok!(ExBurn.LLM.load(model, opts))

    cond do
      parsed[:json] ->
        r = CLI.ok!(ExBurn.LLM.generate(model, prompt, gen_opts))

        CLI.json!(%{
          prompt_ids: r.prompt_ids,
          generated_ids: r.generated_ids,
          text: r.text,
          finish_reason: r.finish_reason
        })

      parsed[:stream] ->
        model |> ExBurn.LLM.stream(prompt, gen_opts) |> Enum.each(&IO.write/1)
        IO.write("\n")

      true ->
        Mix.shell().info(CLI.ok!(ExBurn.LLM.generate(model, prompt, gen_opts)).text)
    end
  end
end
