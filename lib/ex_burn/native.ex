defmodule ExBurn.Native do
  @moduledoc """
  The NIF functions of the `ex_burn` Rust crate (see the NIF contract in the project docs).

  Every function answers `{:ok, value}` or `{:error, {op, reason, details}}`. Use `ExBurn.Tensor`
  rather than calling these directly.

  If the library cannot be loaded (not built, or built for another OTP/NIF version) the module
  still loads, logs why, and every function raises `ExBurn.Error` with op `:nif_not_loaded`.
  """
  require Logger

  @on_load :load_nif

  # {name, arity} of every NIF in the contract; the stubs below are generated from this table.
  @nifs [
    shape: 1,
    type: 1,
    device: 1,
    deallocate: 1,
    devices: 0,
    supports_type: 2,
    auto_device: 0,
    compiled_kinds: 0,
    from_binary: 4,
    to_binary: 2,
    full: 4,
    iota: 4,
    eye: 3,
    unary: 3,
    binary: 4,
    select: 4,
    clip: 4,
    as_type: 2,
    reduce: 5,
    arg_reduce: 6,
    reshape: 2,
    transpose: 2,
    broadcast: 4,
    slice: 4,
    concatenate: 3,
    stack: 3,
    to_device: 2,
    dot: 8,
    set_matmul_precision: 1,
    matmul_precision: 0,
    set_math_mode: 1,
    math_mode: 0,
    reverse: 3,
    sort: 4,
    argsort: 4,
    cumulative: 4,
    put_slice: 4,
    take: 3,
    take_along_axis: 3,
    gather: 3,
    indexed: 6,
    conv: 4,
    window_reduce: 4,
    window_scatter: 7,
    pad: 4,
    model_new: 6,
    model_summary: 1,
    model_set_schedule: 2,
    model_train_epoch: 5,
    model_cancel: 2,
    model_evaluate: 4,
    model_predict: 3,
    model_to_bytes: 1,
    model_load_bytes: 2,
    model_configure: 2,
    model_free: 1,
    program_new: 4,
    program_run: 2,
    pretrained_list: 1,
    embedder_load: 2,
    embedder_info: 1,
    embedder_tokenize: 2,
    embedder_embed: 2,
    embedder_embed_ids: 2,
    reranker_load: 2,
    reranker_info: 1,
    reranker_score: 4,
    candle_kinds: 0,
    llm_load: 2,
    llm_info: 1,
    llm_tokenize: 3,
    llm_detokenize: 2,
    llm_start: 3,
    llm_prompt_ids: 1,
    llm_next: 2,
    llm_step: 2,
    json_decode: 1,
    json_encode: 2
  ]

  @status_key {__MODULE__, :load_status}

  @doc "The `{name, arity}` list of NIFs this module declares."
  def nifs, do: @nifs

  @doc "Path (without extension) the library is loaded from."
  def library_path do
    case :code.priv_dir(:ex_burn) do
      {:error, _} -> Path.join([Application.app_dir(:ex_burn), "priv", "native", "libex_burn"])
      dir -> Path.join([List.to_string(dir), "native", "libex_burn"])
    end
  end

  @doc "True when the NIF library was loaded."
  def loaded?, do: :persistent_term.get(@status_key, {:error, :not_attempted}) == :ok

  @doc "`:ok`, or `{:error, reason}` explaining why the library is not loaded."
  def load_status, do: :persistent_term.get(@status_key, {:error, :not_attempted})

  @doc false
  def load_nif do
    path = library_path()

    status =
      if File.exists?(path <> ".so") do
        case :erlang.load_nif(String.to_charlist(path), 0) do
          :ok -> :ok
          {:error, {:reload, _}} -> :ok
          {:error, {:upgrade, _}} -> :ok
          {:error, reason} -> {:error, reason}
        end
      else
        {:error, {:missing, path <> ".so"}}
      end

    :persistent_term.put(@status_key, status)

    # While Elixir compiles this project the module is loaded from memory (no .beam path) too;
    # stay quiet then: the library may simply not be built yet.
    with {:error, reason} <- status, true <- is_list(:code.which(__MODULE__)) do
      Logger.error("""
      ExBurn: the native library could not be loaded: #{inspect(reason)}
      Expected at #{path}.so. Rebuild it with `mix compile` (needs cargo / Rust >= 1.85; GPU \
      backends are cargo features: `mix help compile.ex_burn_native`). A library built for another OTP/NIF version \
      or architecture must be rebuilt: `mix clean && mix compile`. Every ExBurn operation raises \
      ExBurn.Error (op :nif_not_loaded) until then.
      """)
    end

    # Always :ok, so the module (and loaded?/0) stays usable without the library.
    :ok
  end

  for {name, arity} <- @nifs do
    args = Macro.generate_arguments(arity, __MODULE__)

    @doc false
    def unquote(name)(unquote_splicing(args)) do
      _ = {unquote_splicing(args)}
      # Elixir >= 1.18 infers return types across modules: a stub that can only raise makes every
      # caller's match on its answer look unreachable (warnings). The lookup (never set) keeps
      # the type open; the stub still raises.
      :persistent_term.get({__MODULE__, :stub_answer}, nil) ||
        not_loaded!(unquote(name), unquote(arity))
    end
  end

  defp not_loaded!(name, arity) do
    {reason, details} =
      case load_status() do
        :ok ->
          {"the loaded native library does not implement #{name}/#{arity}", %{}}

        {:error, error} ->
          {"the ExBurn native library is not loaded", %{nif: {name, arity}, load_error: error}}
      end

    raise ExBurn.Error,
      op: :nif_not_loaded,
      reason: reason <> " (rebuild with `mix compile`; features: `mix help compile.ex_burn_native`)",
      details: details
  end
end
