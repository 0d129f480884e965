defmodule ExBurn.Bench.Embed do
  @moduledoc false
  # The :embed suite: all-MiniLM-L6-v2 per engine and device.

  alias ExBurn.Bench

  @model "all-minilm-l6-v2"

  # 32 sentences of everyday length (8 to 30 tokens), the batch the throughput case embeds.
  @texts [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "Machine learning models need good data to generalise well.",
    "She bought fresh bread and cheese at the market this morning.",
    "The weather forecast predicts heavy rain for the weekend.",
    "Our team shipped the new release after two weeks of testing.",
    "How do I reset my password if I no longer have access to my email?",
    "The museum opens at nine and closes at six on weekdays.",
    "Electric cars are becoming cheaper as battery prices fall.",
    "He forgot his umbrella and got soaked on the way home.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Stock markets rallied after the central bank held rates steady.",
    "Please send me the quarterly report before Friday afternoon.",
    "A child is building a sandcastle at the beach.",
    "The library extended its opening hours during exam season.",
    "Researchers found a new species of frog in the rainforest.",
    "The train to the airport leaves every fifteen minutes.",
    "I'd like to book a table for four at seven tonight.",
    "The software update fixed the battery drain on older phones.",
    "Mountains covered in snow reflected the early morning light.",
    "Customer support answered my question within an hour.",
    "The committee will vote on the proposal next Tuesday.",
    "Learning a new language takes patience and daily practice.",
    "The cat slept on the windowsill all afternoon.",
    "Solar panels on the roof now cover most of our electricity use.",
    "The novel follows three generations of a family in Lisbon.",
    "Traffic was light, so we arrived earlier than expected.",
    "The doctor recommended more sleep and less coffee.",
    "A new bridge will connect the two halves of the city.",
    "The orchestra rehearsed the symphony for the gala concert.",
    "Farmers are worried about the dry summer and low rivers.",
    "The startup raised funding to expand into three new markets."
  ]

  def texts, do: @texts

  def plan(opts) do
    for engine <- opts[:engines],
        device <- opts[:devices],
        do: %{label: "#{engine} #{ExBurn.Device.format(device)}", engine: engine, device: device}
  end

  def run(%{engine: :candle, device: {kind, _}}, _opts) when kind != :cpu,
    do: {:skip, "Candle runs on the CPU only"}

  def run(%{engine: engine, device: device}, opts) do
    case ExBurn.Embedding.load(@model, engine: engine, device: device, dir: opts[:dir]) do
      {:ok, model} ->
        fields = %{
          suite: "embed",
          engine: to_string(engine),
          device: ExBurn.Device.format(device),
          implementation: "ExBurn"
        }

        one = hd(@texts)

        {:ok,
         [
           Bench.measure(Map.put(fields, :case, "batch 32"), opts[:iterations], 32, "embeddings/s", fn ->
             ExBurn.Embedding.embed!(model, @texts)
           end),
           Bench.measure(Map.put(fields, :case, "batch 1"), opts[:iterations], 1, "embeddings/s", fn ->
             ExBurn.Embedding.embed!(model, [one])
           end)
         ]}

      {:error, e} ->
        {:skip, Exception.message(e)}
    end
  end
end
