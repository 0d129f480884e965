defmodule ExBurn.Server.Models do
  @moduledoc false
  # The models of a server instance: the catalog (ExBurn.Models.list/1 of the models directory,
  # cached briefly) and the loaded ones, each an ExBurn.Server.Model process under the
  # instance's DynamicSupervisor, registered by id in the instance's Registry with the model's
  # serving process and struct as value.

  alias ExBurn.Server.Instance

  @catalog_ttl_ms 2_000

  @doc "The catalog: `ExBurn.Models.list/1` maps of the models directory."
  def catalog(config) do
    now = System.monotonic_time(:millisecond)

    case :ets.lookup(config.table, :catalog) do
      [{:catalog, expires, list}] when expires > now ->
        list

      _ ->
        list =
          try do
            ExBurn.Models.list(dir: config.models_dir)
          rescue
            _ -> []
          end

        :ets.insert(config.table, {:catalog, now + @catalog_ttl_ms, list})
        list
    end
  end

  @doc "The catalog entry of model `id`, or nil."
  def entry(config, id), do: Enum.find(catalog(config), &(&1.name == id))

  @doc "The ids of the loaded models."
  def loaded(name) when is_atom(name) do
    case Instance.config(name) do
      nil -> []
      config -> loaded(config)
    end
  end

  def loaded(config) do
    Registry.select(config.registry, [{{:"$1", :_, :"$2"}, [{:"/=", :"$2", nil}], [:"$1"]}]) |> Enum.sort()
  end

  @doc "The loaded model `id` as `%{server: pid, model: struct}`, or nil (not loaded)."
  def lookup(config, id) do
    case Registry.lookup(config.registry, id) do
      [{_pid, %{} = value}] -> value
      _ -> nil
    end
  end

  @doc """
  The serving process and struct of catalog entry `entry`, loading the model first if needed:
  `{:ok, %{server: pid, model: struct}}` or `{:error, %ExBurn.Error{}}`.

  A model whose process just died may still be registered for a moment (the Registry forgets
  it asynchronously) and is being restarted by the DynamicSupervisor: this waits for either.
  """
  def ensure(config, entry, tries \\ 100) do
    case lookup(config, entry.name) do
      nil ->
        start(config, entry, tries)

      %{server: server} = value ->
        if serving?(server), do: {:ok, value}, else: retry(config, entry, tries, :dead)
    end
  end

  # An LLM's replicas are a group of this node's schedulers (ExBurn.Server.Model).
  defp serving?({:group, group}), do: Enum.any?(ExBurn.LLM.Scheduler.members(group), &Process.alive?/1)
  defp serving?(pid), do: Process.alive?(pid)

  defp retry(_config, entry, 0, why), do: {:error, load_error(entry, why)}

  defp retry(config, entry, tries, _why) do
    Process.sleep(20)
    ensure(config, entry, tries - 1)
  end

  defp start(config, entry, tries) do
    spec = {ExBurn.Server.Model, {config, entry}}

    case DynamicSupervisor.start_child(config.models_sup, spec) do
      {:ok, _pid} -> found(config, entry, tries)
      {:error, {:already_started, _pid}} -> found(config, entry, tries)
      {:error, {%ExBurn.Error{} = e, _}} -> {:error, e}
      {:error, %ExBurn.Error{} = e} -> {:error, e}
      {:error, reason} -> {:error, load_error(entry, reason)}
    end
  catch
    :exit, reason -> {:error, load_error(entry, reason)}
  end

  defp found(config, entry, tries) do
    case lookup(config, entry.name) do
      %{server: server} = value ->
        if serving?(server), do: {:ok, value}, else: retry(config, entry, tries, :dead)

      nil ->
        retry(config, entry, tries, :not_registered)
    end
  end

  defp load_error(entry, reason) do
    %ExBurn.Error{
      op: :server,
      reason: "model #{entry.name} could not be loaded",
      details: %{exit: inspect(reason)}
    }
  end

  @doc "Loads the given model ids (or `:all`) now; failures are logged."
  def preload(name, ids) do
    config = Instance.config(name)
    catalog = catalog(config)
    ids = if ids == :all, do: Enum.map(catalog, & &1.name), else: ids

    for id <- ids do
      case Enum.find(catalog, &(&1.name == id)) do
        nil ->
          require Logger
          Logger.error("ExBurn.Server: cannot preload #{id}: no such model in #{config.models_dir}")

        entry ->
          with {:error, e} <- ensure(config, entry) do
            require Logger
            Logger.error("ExBurn.Server: cannot preload #{id}: #{Exception.message(e)}")
          end
      end
    end

    :ok
  end
end

defmodule ExBurn.Server.Model do
  @moduledoc false
  # One loaded model of a server: loads it (in init, so a concurrent start of the same id finds
  # the name taken and waits for this one) and starts its serving process, linked: if that
  # process dies this one does too and the DynamicSupervisor starts both again. With
  # `:replicas`, an LLM is loaded once per replica, and its schedulers, all linked, form a
  # group of this node's (the registered server is `{:group, group}`).

  use GenServer, restart: :permanent

  def start_link({config, entry}) do
    GenServer.start_link(__MODULE__, {config, entry}, name: {:via, Registry, {config.registry, entry.name}})
  end

  @impl true
  def init({config, entry}) do
    load_opts = [dir: config.models_dir] ++ config.load_opts

    with {:ok, value} <- start(entry, load_opts, config) do
      Registry.update_value(config.registry, entry.name, fn _ -> value end)
      {:ok, value}
    else
      {:error, e} -> {:stop, e}
    end
  end

  defp start(%{kind: :llm} = entry, load_opts, %{replicas: [_ | _] = replicas} = config) do
    # node-local, so that servers of the same name on connected nodes keep their own replicas
    group = {ExBurn.Server, node(), config.name, entry.name}

    Enum.reduce_while(replicas, {:ok, nil}, fn replica_opts, {:ok, first} ->
      with {:ok, model} <- ExBurn.LLM.load(entry.name, Keyword.merge(load_opts, replica_opts)),
           {:ok, _} <- ExBurn.LLM.Scheduler.start_link(model, [group: group] ++ scheduler_opts(config)) do
        {:cont, {:ok, first || model}}
      else
        error -> {:halt, error}
      end
    end)
    |> case do
      {:ok, model} -> {:ok, %{server: {:group, group}, model: model}}
      error -> error
    end
  end

  defp start(entry, load_opts, config) do
    with {:ok, model} <- load(entry.kind, entry.name, load_opts),
         {:ok, server} <- serve(model, config),
         do: {:ok, %{server: server, model: model}}
  end

  defp load(:embedding, id, opts), do: ExBurn.Embedding.load(id, opts)
  defp load(:llm, id, opts), do: ExBurn.LLM.load(id, opts)
  defp load(:reranker, id, opts), do: ExBurn.Rerank.load(id, opts)

  defp serve(%ExBurn.Embedding{} = model, config) do
    with :ok <- warm_up(model, config) do
      ExBurn.Serving.Batcher.start_link(model,
        batch_size: config.batch_size,
        batch_timeout: config.batch_timeout,
        max_queue: max(4 * config.max_inputs, 1024)
      )
    end
  end

  # A reranker scores in each request's process (ExBurn.Server.Inference.rerank/3); its process
  # only holds the model's place among the loaded ones.
  defp serve(%ExBurn.Rerank{}, _config), do: Agent.start_link(fn -> nil end)

  defp serve(%ExBurn.LLM{} = model, config),
    do: ExBurn.LLM.Scheduler.start_link(model, scheduler_opts(config))

  # the server's `:warmup` warms an embedder at batch sizes 1 and `:batch_size` (the schedulers
  # take it as their own option)
  defp warm_up(model, config) do
    if config.scheduler[:warmup] in [nil, false] do
      :ok
    else
      with {:ok, _} <-
             ExBurn.Embedding.warm_up(model,
               batch_sizes: ExBurn.Pretrained.WarmUp.embedder_sizes(config.batch_size)
             ),
           do: :ok
    end
  end

  defp scheduler_opts(config), do: [max_queue: config.max_queue] ++ config.scheduler
end
