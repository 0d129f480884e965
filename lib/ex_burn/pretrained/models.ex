defmodule ExBurn.Models do
  @moduledoc """
  The models directory: where pre-trained models live and how they are found.

  The layout:

      <models dir>/
        embeddings/<name>/   model.safetensors, config.json, tokenizer.json, 1_Pooling/, ...
        llm/<name>/          one .gguf file, or a Hugging Face directory: config.json,
                             model.safetensors (or shards and their index), tokenizer.json
        rerankers/<name>/    a cross-encoder: model.safetensors, config.json, tokenizer.json
        registry.json        optional catalog

  The directory is, in order: the `:dir` option, the `EXBURN_MODELS_DIR` environment variable,
  `config :ex_burn, models_dir: ...`, then `~/models` (`ExBurn.Env`'s order). Everything that
  needs the directory asks `dir/1`.
  """

  @doc "The models directory (see the moduledoc for how it is chosen)."
  @spec dir(keyword) :: Path.t()
  def dir(opts \\ [])

  def dir(opts) when not is_list(opts),
    do: raise(ExBurn.Error, op: :models_dir, reason: "options must be a keyword list", details: %{got: opts})

  def dir(opts) do
    :models_dir |> ExBurn.Env.get(opts[:dir]) |> Path.expand()
  end

  @doc """
  The models found in the models directory: one map per model with `:name`, `:kind`
  (`:embedding`, `:llm` or `:reranker`), `:path`, `:format` (`:safetensors` or `:gguf`), `:arch` (the
  architecture the files declare, or nil) and `:bytes`. A missing directory has no models.
  `registry.json` entries override scanned ones of the same name.
  """
  @spec list(keyword) :: [map]
  def list(opts \\ []) do
    opts |> dir() |> ExBurn.Native.pretrained_list() |> ExBurn.Error.unwrap!()
  end
end
