package kafka_batch_peers;

import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Properties;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.AggregateFunction;
import org.apache.flink.api.common.serialization.DeserializationSchema;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.java.tuple.Tuple4;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestartStrategyOptions;
import org.apache.flink.connector.base.DeliveryGuarantee;
import org.apache.flink.connector.jdbc.JdbcExactlyOnceOptions;
import org.apache.flink.connector.jdbc.JdbcExecutionOptions;
import org.apache.flink.connector.jdbc.core.datastream.sink.JdbcSink;
import org.apache.flink.connector.kafka.sink.KafkaRecordSerializationSchema;
import org.apache.flink.connector.kafka.sink.KafkaSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.core.execution.CheckpointingMode;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.windowing.ProcessWindowFunction;
import org.apache.flink.streaming.api.windowing.assigners.TumblingEventTimeWindows;
import org.apache.flink.streaming.api.windowing.windows.TimeWindow;
import org.apache.flink.util.Collector;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.postgresql.xa.PGXADataSource;

/**
 * The pipeline's two cases as Apache Flink jobs, written as Flink's documentation advises for exactly-once
 * (DataStream API, checkpointing in EXACTLY_ONCE mode, run in the local MiniCluster that
 * StreamExecutionEnvironment starts in a plain JVM with flink-clients on the classpath):
 *
 * <ul>
 *   <li>{@code aggregate}: a bounded KafkaSource over the batch's offset ranges (read_committed), views and
 *       total duration per page and minute of the record's Kafka timestamp (event-time tumbling windows,
 *       closed by the watermark the source emits at the end of its input: no record is late), into
 *       Postgres through the JDBC sink in exactly-once mode (XA, a transaction per connection as the
 *       connector's guide says for PostgreSQL, no retries); the offsets are Flink's own, in its
 *       checkpoints, and committed to the Kafka group on each checkpoint (the Kafka connector's
 *       guide).</li>
 *   <li>{@code publish}: the same ranges, each record published to a topic keyed by its user, its value
 *       the page and the duration, through KafkaSink in EXACTLY_ONCE.</li>
 * </ul>
 *
 * A bounded job ends after its final checkpoint, which commits the sinks' transactions. What it read is
 * checked in what it wrote (an accumulator of the records read came back 0 now and then). Run by make
 * bench (scripts/bench/peers/launch.py compiles it):
 *
 * <pre>java -cp ... kafka_batch_peers.FlinkPageViews aggregate|publish bootstrap group ranges target [jdbc-url user password]</pre>
 *
 * {@code ranges}: topic:partition:from:until,...; {@code target}: the table, or the output topic.
 */
public final class FlinkPageViews {
    private static final ObjectMapper JSON = new ObjectMapper();

    private FlinkPageViews() {
    }

    /** A page view as the pipeline reads it: its fields and its record's Kafka timestamp. */
    public static final class View {
        public String userId;
        public String page;
        public long durationMs;

        public View() {
        }
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0];
        String bootstrap = args[1];
        String group = args[2];
        Map<TopicPartition, Long> starts = new HashMap<>();
        Map<TopicPartition, Long> untils = new HashMap<>();
        for (String range : args[3].split(",")) {
            String[] part = range.split(":");
            TopicPartition tp = new TopicPartition(part[0], Integer.parseInt(part[1]));
            starts.put(tp, Long.parseLong(part[2]));
            untils.put(tp, Long.parseLong(part[3]));
        }
        String target = args[4];

        // The aggregate in one attempt: a run that fails ends with its error and the bench's check, instead of
        // restarting from its last checkpoint (Flink's default with checkpoints: without end). Once, a 3M run's
        // restarts wrote windows already committed again, and the duplicate key failed each restart for 30
        // minutes. KafkaSink's restarts recover as its guide says, so the publishing job keeps them.
        Configuration conf = new Configuration();
        if (mode.equals("aggregate")) {
            conf.set(RestartStrategyOptions.RESTART_STRATEGY, "disable");
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment(conf);
        env.enableCheckpointing(1000, CheckpointingMode.EXACTLY_ONCE);
        KafkaSource<View> source = KafkaSource.<View>builder()
                .setBootstrapServers(bootstrap)
                .setPartitions(new HashSet<>(starts.keySet()))
                .setGroupId(group)
                .setStartingOffsets(OffsetsInitializer.offsets(starts))
                .setBounded(OffsetsInitializer.offsets(untils))
                .setProperty(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed")
                .setProperty("commit.offsets.on.checkpoint", "true")
                .setValueOnlyDeserializer(new ViewDeserializer())
                .build();
        DataStream<View> views = env.fromSource(source, WatermarkStrategy.noWatermarks(), "page views");

        if (mode.equals("aggregate")) {
            aggregate(views, target, args[5], args[6], args[7]);
        } else {
            publish(views, bootstrap, target, group);
        }
        env.execute("page views " + mode);
    }

    private static void aggregate(DataStream<View> views, String table, String url, String user, String password) {
        views.keyBy(view -> view.page)
                .window(TumblingEventTimeWindows.of(Duration.ofMinutes(1)))
                .aggregate(new Totals(), new PerMinute())
                .sinkTo(JdbcSink.<Tuple4<String, Long, Long, Long>>builder()
                        .withQueryStatement(
                                "INSERT INTO " + table + " (page, minute, views, total_duration_ms) VALUES (?, ?, ?, ?)",
                                (statement, row) -> {
                                    statement.setString(1, row.f0);
                                    statement.setObject(2, OffsetDateTime.ofInstant(Instant.ofEpochMilli(row.f1), ZoneOffset.UTC));
                                    statement.setLong(3, row.f2);
                                    statement.setLong(4, row.f3);
                                })
                        .withExecutionOptions(JdbcExecutionOptions.builder().withMaxRetries(0).build())
                        .buildExactlyOnce(JdbcExactlyOnceOptions.builder().withTransactionPerConnection(true).build(),
                                () -> {
                                    PGXADataSource xa = new PGXADataSource();
                                    xa.setUrl(url);
                                    xa.setUser(user);
                                    xa.setPassword(password);
                                    return xa;
                                }));
    }

    private static void publish(DataStream<View> views, String bootstrap, String topic, String group) {
        Properties producer = new Properties();
        producer.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "900000");  // the broker's maximum, 15 minutes
        views.sinkTo(KafkaSink.<View>builder()
                .setBootstrapServers(bootstrap)
                .setKafkaProducerConfig(producer)
                .setDeliveryGuarantee(DeliveryGuarantee.EXACTLY_ONCE)
                .setTransactionalIdPrefix(group)
                .setRecordSerializer(new Published(topic))
                .build());
    }

    /** A page view as the Kafka sink publishes it: keyed by its user, its value the page and the duration. */
    static final class Published implements KafkaRecordSerializationSchema<View> {
        private final String topic;

        Published(String topic) {
            this.topic = topic;
        }

        @Override
        public ProducerRecord<byte[], byte[]> serialize(View view, KafkaSinkContext context, Long timestamp) {
            ObjectNode value = JSON.createObjectNode();
            value.put("page", view.page);
            value.put("duration_ms", view.durationMs);
            try {
                return new ProducerRecord<>(topic, view.userId.getBytes(StandardCharsets.UTF_8),
                        JSON.writeValueAsBytes(value));
            } catch (JsonProcessingException e) {
                throw new UncheckedIOException(e);
            }
        }
    }

    /** The record's value parsed, as the pipeline's JSON decoder reads it. */
    static final class ViewDeserializer implements DeserializationSchema<View> {
        @Override
        public View deserialize(byte[] message) throws java.io.IOException {
            JsonNode node = JSON.readTree(message);
            View view = new View();
            view.userId = node.path("user_id").asText();
            view.page = node.path("page").asText();
            view.durationMs = node.path("duration_ms").asLong();
            return view;
        }

        @Override
        public boolean isEndOfStream(View next) {
            return false;
        }

        @Override
        public TypeInformation<View> getProducedType() {
            return TypeInformation.of(View.class);
        }
    }

    /** Views and total duration of a window: {views, duration}. */
    static final class Totals implements AggregateFunction<View, long[], long[]> {
        @Override
        public long[] createAccumulator() {
            return new long[2];
        }

        @Override
        public long[] add(View view, long[] totals) {
            totals[0] += 1;
            totals[1] += view.durationMs;
            return totals;
        }

        @Override
        public long[] getResult(long[] totals) {
            return totals;
        }

        @Override
        public long[] merge(long[] a, long[] b) {
            return new long[] {a[0] + b[0], a[1] + b[1]};
        }
    }

    /** A window's totals as a row: (page, minute's start in epoch milliseconds, views, total duration). */
    static final class PerMinute extends ProcessWindowFunction<long[], Tuple4<String, Long, Long, Long>, String, TimeWindow> {
        @Override
        public void process(String page, Context context, Iterable<long[]> totals,
                            Collector<Tuple4<String, Long, Long, Long>> out) {
            long[] sum = totals.iterator().next();
            out.collect(Tuple4.of(page, context.window().getStart(), sum[0], sum[1]));
        }
    }
}
