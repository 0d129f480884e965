defmodule ExBurn.Bench.LLM do
  @moduledoc false
  # The :llm suite: SmolLM2-135M-Instruct, greedy generation per engine and device.

  alias ExBurn.Bench

  @model "smollm2-135m-instruct"
  # a plain completion the model continues past 32 tokens (no end-of-turn token early)
  @prompt "Once upon a time, in a small village by the sea,"
  @tokens 32

  def prompt, do: @prompt
  def tokens, do: @tokens

  def plan(opts), do: ExBurn.Bench.Embed.plan(opts)

  def run(%{engine: :candle, device: {kind, _}}, _opts) when kind != :cpu,
    do: {:skip, "Candle runs on the CPU only"}

  def run(%{engine: engine, device: device}, opts) do
    case ExBurn.LLM.load(@model, engine: engine, device: device, dir: opts[:dir]) do
      {:ok, model} ->
        fields = %{
          suite: "llm",
          case: "#{@tokens} tokens",
          engine: to_string(engine),
          device: ExBurn.Device.format(device),
          implementation: "ExBurn"
        }

        # generation may stop early at an end-of-turn token: count what was generated
        gen = fn -> ExBurn.LLM.generate!(model, @prompt, max_tokens: @tokens, greedy: true) end

        case gen.().usage.completion_tokens do
          0 -> {:skip, "the model generated no tokens for the benchmark prompt"}
          n -> {:ok, [Bench.measure(fields, max(div(opts[:iterations], 3), 2), n, "tokens/s", gen)]}
        end

      {:error, e} ->
        {:skip, Exception.message(e)}
    end
  end
end
